#!/bin/bash
# Run 63 (prepared 2026-12-07, fifteenth session): issue 10's 8B step at 1 / 8 / 64 rows with
# the kernels that are off until a GPU runs them, against the defaults in the same call:
# the paged decode merge's vector form (NINFER_DECODE_MERGE_VECTOR), the residual add and
# MLP norm as one kernel (NINFER_ADD_NORM_KERNEL) and the attention prologue, q/k norms,
# RoPE and the K/V page writes as one kernel (NINFER_ATTENTION_PROLOGUE); then those with
# every projection of at most 16 rows through the split-K skinny matmul
# (NINFER_SKINNY_MATMUL). Their native tests first; a switch whose tests fail stays off.
# Then, in the time left, NEW's 1-row step under the profiler with source lines (what is
# left of the ~20 small kernels a layer).
# From the repository root, carry [".whl"]; one call, at most ~480 s (END=S: S seconds):
#   bash benchmarks/results/run63/device_run63.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o63; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run63.tgz" -C /tmp o63; }
stamp gpu-tests
timeout 120 python3 -m pytest -rA -m gpu tests/kernels/test_paged_attention.py \
  tests/kernels/test_add_norm.py tests/kernels/test_attention_prologue.py \
  tests/kernels/test_skinny_matmul.py \
  > "$OUT/pytest-gpu.log" 2>&1
stamp "gpu-tests rc=$?"; tail -1 "$OUT/pytest-gpu.log" | tee -a "$OUT/stages.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | cut -c1-200 | tee -a "$OUT/stages.log"
NEW=""
failed() { grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | grep -q "$1"; }
failed test_paged_attention || NEW="$NEW NINFER_DECODE_MERGE_VECTOR=1"
failed test_add_norm || NEW="$NEW NINFER_ADD_NORM_KERNEL=1"
failed test_attention_prologue || NEW="$NEW NINFER_ATTENTION_PROLOGUE=1"
stamp "NEW=$NEW"; save
stamp artifact
[ -d /tmp/q8.ninfer ] || timeout 80 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b \
  --quiet /tmp/q8.ninfer > "$OUT/artifact.log" 2>&1
stamp "artifact rc=$?"
step() {  # step NAME CAP [ENV=VALUE ...] [-- EXTRA ARGS]
  local name=$1 cap=$2; shift 2; local envs=(); while [ $# -gt 0 ] && [ "$1" != -- ]; do
    envs+=("$1"); shift; done; [ "$1" = -- ] && shift
  stamp "$name"
  env "${envs[@]}" timeout $cap python3 benchmarks/runner_bench.py /tmp/q8.ninfer \
    --batches 1,8,64 --context 1024 --prompt 256 --steps 32 --max-context 4096 \
    --modes pipelined --json "$@" > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
  stamp "$name rc=$?"
  grep '"decode"' "$OUT/$name.jsonl" | cut -c1-240 | tee -a "$OUT/stages.log"; save
}
step dense 90
[ -n "$NEW" ] && step dense-new 90 $NEW
failed test_skinny_matmul || step dense-new-skinny 90 $NEW NINFER_SKINNY_MATMUL=1
left=$(( ${END:-480} - 10 - $(date +%s) + t0 ))
[ -n "$NEW" ] && [ $left -gt 60 ] && step dense-new-prof $left $NEW -- --batches 1 \
  --profile /tmp/prof63
save; ls -la "$OUT"
