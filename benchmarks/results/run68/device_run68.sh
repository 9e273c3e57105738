#!/bin/bash
# Run 68 (prepared 2026-12-08, sixteenth session; any card): the decode kernel's outputs at
# many rows. Run 66's profile (H100, the 8B at a 4k table, 384-token rows) had per layer at
# 256 rows (one split) float32 partials of 16.8 MB written and read back and two XLA fusions
# after the kernel (the merge's max / exp and the slice to the real query rows, ~4.8 us), and
# at 64 rows (4 splits, XLA's merge below MERGE_KERNEL_MIN_SPLITS = 8) every split's
# partials stored, used or not, then the merge's exp and slice fusions (~3.8 us). Arms:
# NINFER_DECODE_DIRECT_OUTPUT=1 (one split stores its normalised rows in bf16, no merge;
# new, off by default), and with it `--merge-min-splits 2` (the vector merge kernel, which
# reads and lets the kernel store only the splits holding keys, from 2 splits on).
# Native tests of the direct output first. Then the 8B step at 1 / 64 / 256 rows.
# From the repository root, carry [".whl"]; one call, ~360 s (END=S: S seconds):
#   bash benchmarks/results/run68/device_run68.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o68; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run68.tgz" -C /tmp o68; }
left() { echo $(( ${END:-360} - $(date +%s) + t0 )); }
stamp gpu-tests
timeout 40 python3 -m pytest -rA -m gpu tests/kernels/test_paged_attention.py \
  -k "direct_output" > "$OUT/pytest-gpu.log" 2>&1
stamp "gpu-tests rc=$?"; tail -1 "$OUT/pytest-gpu.log" | tee -a "$OUT/stages.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | cut -c1-200 | tee -a "$OUT/stages.log"; save
artifact_8b
step() {  # step NAME ENV=VALUE... -- [runner_bench args]: the 8B step, 384-token contexts
  local name=$1 envs=() ; shift
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  stamp "$name"
  env X=0 "${envs[@]}" timeout 90 python3 benchmarks/runner_bench.py /tmp/q8.ninfer \
    --batches 1,64,256 --context 384 --prompt 256 --steps 32 --json --modes pipelined \
    --max-context 4096 "$@" > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
  stamp "$name rc=$?"; show "$OUT/$name.jsonl"; save
}
step step --
step step-direct NINFER_DECODE_DIRECT_OUTPUT=1 --
step step-direct-merge2 NINFER_DECODE_DIRECT_OUTPUT=1 -- --merge-min-splits 2
save; ls -la "$OUT"
