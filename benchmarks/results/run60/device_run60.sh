#!/bin/bash
# Run 60 (prepared 2026-12-07, thirteenth session; any card): the routed experts' GEMV on the
# tensor cores (kernels/moe/kernel.py GEMV_ON_TENSOR_CORES, NINFER_MOE_GEMV_DOT=1: the row
# padded to 16 through a dot, no widening of the weights, no [block_k, block_n] sum at the
# end) against the FMA loop: its native tests, the 35B-A3B at 1 / 8 rows both ways in one
# call, then the faster one's 2-row step under the profiler. Run 57's profile had the FMA
# GEMVs at ~2 TB/s, 1.09 ms of a 3.64 ms step on an H100.
# From the repository root, carry [".whl"]; one call, ~420 s (END=S: fewer):
#   bash benchmarks/results/run60/device_run60.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o60; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run60.tgz" -C /tmp o60; }
left() { echo $(( ${END:-450} - $(date +%s) + t0 )); }
stamp gpu-tests
timeout 150 python3 -m pytest -rA -m gpu tests/kernels/test_moe.py > "$OUT/pytest-gpu.log" 2>&1
stamp "gpu-tests rc=$?"; tail -2 "$OUT/pytest-gpu.log" | tee -a "$OUT/stages.log"
DOT=0; grep -q "passed" "$OUT/pytest-gpu.log" && ! grep -q "FAILED" "$OUT/pytest-gpu.log" && DOT=1
H="python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --no-gdn"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.97
bench() {  # bench DOT [--profile DIR]
  local name="moe35-dot$1${2:+-prof}" cap=$(( $(left) - 5 ))
  [ $cap -gt 140 ] && cap=140
  [ $cap -lt 80 ] && { stamp "no time for $name"; return; }
  stamp "$name ($cap s)"
  NINFER_MOE_GEMV_DOT=$1 timeout $cap $H --batches 1,8 $2 $3 > "$OUT/$name.jsonl" \
    2> "$OUT/$name.log"
  stamp "$name rc=$?"
  grep '"decode"' "$OUT/$name.jsonl" | cut -c1-200 | tee -a "$OUT/stages.log"
  save
}
bench 0
[ $DOT = 1 ] && bench 1 && bench 1 --profile /tmp/prof
save; ls -la "$OUT"
