#!/bin/bash
# Run 57 (2026-12-07, thirteenth session): after run 56 (H100: the router kernel cost
# 0.59 ms a step at batch 1 and saved 0.17 ms at 8; the fused GDN rows failed their native
# test at a float32 tolerance): the fused GDN rows' native tests (float32 tight, bfloat16 at
# its rounding), the 35B-A3B at 1 / 8 rows with the GDN switch off and on (g and beta now one
# array), then the 1- and 8-row steps with both kernels on under the profiler (the router
# kernel's own time, each kernel's source lines).
# From the repository root, carry [".whl"]; one call, ~400 s (END=S: fewer):
#   bash benchmarks/results/run57/device_run57.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o57; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run57.tgz" -C /tmp o57; }
left() { echo $(( ${END:-450} - $(date +%s) + t0 )); }
stamp gpu-tests
timeout 120 python3 -m pytest -rA -m gpu tests/kernels/test_gated_delta.py \
  > "$OUT/pytest-gpu.log" 2>&1
stamp "gpu-tests rc=$?"; grep -E "^(PASSED|FAILED)|passed|failed" "$OUT/pytest-gpu.log" \
  | tail -6 | tee -a "$OUT/stages.log"
H="python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --no-gdn"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.97
bench() {  # bench GDN ROUTER [--profile DIR]: one configuration's decode figures at 1 / 8 rows
  local name="moe35-g$1r$2${3:+-prof}" cap=$(( $(left) - 5 ))
  [ $cap -gt 140 ] && cap=140
  [ $cap -lt 80 ] && { stamp "no time for $name"; return; }
  stamp "$name ($cap s)"
  NINFER_GDN_FUSED_ROWS=$1 NINFER_MOE_ROUTER_KERNEL=$2 timeout $cap $H --batches 1,8 $3 $4 \
    > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
  stamp "$name rc=$?"
  grep '"decode"' "$OUT/$name.jsonl" | cut -c1-200 | tee -a "$OUT/stages.log"
  save
}
bench 0 0
bench 1 0
bench 1 1 --profile /tmp/prof
save; ls -la "$OUT"
