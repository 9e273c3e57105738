#!/bin/bash
# Run 64 (prepared 2026-12-07, fifteenth session): runs 61 and 63 folded into one call for a
# lease with little time left. First the native tests of every kernel changed since the last
# GPU run: the paged decode kernel's in-kernel query padding and the merges' real-row stores
# (on by default), the vector merge (NINFER_DECODE_MERGE_VECTOR), the fused GDN gates
# (NINFER_GDN_FUSED_GATES), the add + norm kernel (NINFER_ADD_NORM_KERNEL), the attention
# prologue (NINFER_ATTENTION_PROLOGUE), the skinny matmul (NINFER_SKINNY_MATMUL), the MoE
# GEMVs. A switch whose tests fail stays off. Then issue 10's 8B step at 1 / 8 rows with
# the defaults and with NEW (the passing switches), and NEW plus the skinny matmul; on an H200
# issue 11's 35B-A3B at 1 / 8 rows with NEW first.
# From the repository root, carry [".whl"]; one call, at most ~540 s (END=S: S seconds):
#   bash benchmarks/results/run64/device_run64.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o64; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run64.tgz" -C /tmp o64; }
stamp gpu-tests
timeout 150 python3 -m pytest -rA -m gpu tests/kernels/test_paged_attention.py \
  tests/kernels/test_add_norm.py tests/kernels/test_attention_prologue.py \
  tests/kernels/test_skinny_matmul.py tests/kernels/test_gated_delta.py tests/kernels/test_moe.py \
  > "$OUT/pytest-gpu.log" 2>&1
stamp "gpu-tests rc=$?"; tail -1 "$OUT/pytest-gpu.log" | tee -a "$OUT/stages.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | cut -c1-200 | tee -a "$OUT/stages.log"; save
failed() { grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | grep -q "$1"; }
NEW=""
failed test_paged_attention || NEW="$NEW NINFER_DECODE_MERGE_VECTOR=1"
failed test_add_norm || NEW="$NEW NINFER_ADD_NORM_KERNEL=1"
failed test_attention_prologue || NEW="$NEW NINFER_ATTENTION_PROLOGUE=1"
failed test_gated_delta || NEW="$NEW NINFER_GDN_FUSED_GATES=1"
stamp "NEW=$NEW"
moe35() {  # moe35 NAME CAP BATCHES [ENV=VALUE ...]: the 35B-A3B's step
  local name=$1 cap=$2 batches=$3; shift 3
  stamp "$name"
  env XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 "$@" timeout $cap python3 benchmarks/hybrid_bench.py \
    --json --presets qwen3.6-35b-a3b --no-gdn --batches $batches > "$OUT/$name.jsonl" \
    2> "$OUT/$name.log"
  stamp "$name rc=$?"
  grep '"decode"' "$OUT/$name.jsonl" | cut -c1-220 | tee -a "$OUT/stages.log"; save
}
if grep -q H200 "$OUT/stages.log"; then
  moe35 moe35-new 110 1,8 X=0 $NEW
  # the expert MLP as one kernel (NINFER_MOE_FUSED_MLP) on top, at one row
  failed test_moe || moe35 moe35-new-fused 80 1 $NEW NINFER_MOE_FUSED_MLP=1
fi
stamp artifact
[ -d /tmp/q8.ninfer ] || timeout 80 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b \
  --quiet /tmp/q8.ninfer > "$OUT/artifact.log" 2>&1
stamp "artifact rc=$?"
step() {  # step NAME CAP [ENV=VALUE ...]
  local name=$1 cap=$2; shift 2
  local left=$(( ${END:-540} - 5 - $(date +%s) + t0 ))
  [ $left -lt 45 ] && { stamp "$name: no time ($left s)"; return; }
  [ $cap -gt $left ] && cap=$left
  stamp "$name"
  env "$@" timeout $cap python3 benchmarks/runner_bench.py /tmp/q8.ninfer \
    --batches 1,8 --context 1024 --prompt 256 --steps 32 --max-context 4096 \
    --modes pipelined --json > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
  stamp "$name rc=$?"
  grep '"decode"' "$OUT/$name.jsonl" | cut -c1-240 | tee -a "$OUT/stages.log"; save
}
step dense 100 X=0
[ -n "$NEW" ] && step dense-new 100 $NEW
failed test_skinny_matmul || step dense-new-skinny 100 $NEW NINFER_SKINNY_MATMUL=1
save; ls -la "$OUT"
