#!/bin/bash
# Run 67 (prepared 2026-12-08, sixteenth session): the step with this session's defaults:
# the decode splits follow the rows' lengths where the grid has at most 16 (row, kv head)
# pairs (runs 65-66: the 8B's one row +1.1-1.6% on an H100), and the attention prologue
# takes the q / k norm weights as stored (run 66's profile: a stack + convert kernel per
# layer, 1.3 us x 36). The prologue's native tests first (run 66 ran the decode kernel's
# with either split).
# On an H200: issue 11's 35B-A3B at 1 / 8 rows (300 tok/s at one row is an H200 target;
# 278.9 on an H100 in run 65), then the 8B step at 1 / 8 rows (issue 10's 240 at one row).
# On any other card: the 35B-A3B with and without the length's splits (its 2 kv heads: 4
# pairs at one row), then the 8B step.
# From the repository root, carry [".whl"]; one call, ~330 s (END=S: S seconds):
#   bash benchmarks/results/run67/device_run67.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o67; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run67.tgz" -C /tmp o67; }
left() { echo $(( ${END:-330} - $(date +%s) + t0 )); }
stamp gpu-tests
timeout 40 python3 -m pytest -rA -m gpu tests/kernels/test_attention_prologue.py \
  > "$OUT/pytest-gpu.log" 2>&1
stamp "gpu-tests rc=$?"; tail -1 "$OUT/pytest-gpu.log" | tee -a "$OUT/stages.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | cut -c1-200 | tee -a "$OUT/stages.log"; save
moe35() {  # moe35 NAME [ENV=VALUE ...]: the 35B-A3B's step at 1 / 8 rows
  local name=$1; shift
  stamp "$name"
  env XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 X=0 "$@" timeout 110 python3 \
    benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --no-gdn --batches 1,8 \
    > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
  stamp "$name rc=$?"; show "$OUT/$name.jsonl"; save
}
dense() {  # dense NAME [ENV=VALUE ...]: the 8B step at 1 / 8 rows (run 64's command)
  local name=$1; shift
  artifact_8b
  stamp "$name"
  env "$@" timeout $(( $(left) - 5 )) python3 benchmarks/runner_bench.py /tmp/q8.ninfer \
    --batches 1,8 --context 1024 --prompt 256 --steps 32 --max-context 4096 \
    --modes pipelined --json > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
  stamp "$name rc=$?"; show "$OUT/$name.jsonl"; save
}
moe35 moe35
grep -q H200 "$OUT/stages.log" || [ $(left) -lt 100 ] || moe35 moe35-table \
  NINFER_DECODE_FOLLOW_LENGTH=0
[ $(left) -gt 100 ] && dense dense
save; ls -la "$OUT"
