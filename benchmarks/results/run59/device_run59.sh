#!/bin/bash
# Run 59 (prepared 2026-12-07, thirteenth session): issue 11's 35B-A3B on an H200 only (its
# 300 tok/s is an H200 figure; runs 56-58 got H100s: 273.4 tok/s there). On any other card it
# stops at once, so a lease that brings an H100 costs only its start. The default (fused GDN
# rows, router kernel) at 1 / 8 / 64 rows, then the expert GEMV on the tensor cores
# (NINFER_MOE_GEMV_DOT=1, run 60's subject) and both new kernels off at 1 / 8 rows.
# From the repository root, carry [".whl"]; one call, ~300 s:
#   bash benchmarks/results/run59/device_run59.sh
FINAL=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$FINAL/gpu.txt"
grep -q H200 "$FINAL/gpu.txt" || { echo "not an H200: nothing run"; exit 0; }
export OUT=/tmp/o59; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
save() { tar czf "$FINAL/run59.tgz" -C /tmp o59; }
H="python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --no-gdn"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.97
run() {  # run NAME BATCHES [ENV=VALUE ...]
  local name=$1 batches=$2; shift 2
  stamp "$name"
  env "$@" timeout 140 $H --batches $batches > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
  stamp "$name rc=$?"
  grep '"decode"' "$OUT/$name.jsonl" | cut -c1-200 | tee -a "$OUT/stages.log"; save
}
run default 1,8,64
run gemv-dot 1,8 NINFER_MOE_GEMV_DOT=1
run off 1,8 NINFER_GDN_FUSED_ROWS=0 NINFER_MOE_ROUTER_KERNEL=0
ls -la "$OUT"
