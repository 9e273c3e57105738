#!/bin/bash
# Run 29 (2026-12-04): issue 10's live 8B server against its bare step on main as it stands
# (tensor parallelism's runner changes landed after run 19/20: mesh=None must keep the one-device
# path), cold and warm start; then issue 19's Gemma 4 31B shape through JaxRunner (batch 1/8
# decode against the same process's GEMV ceiling, 4k prefill).
# From the repository root, carry [".whl"]: bash benchmarks/results/run29/device_run29.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
stamp serve-bench
timeout 390 python3 benchmarks/gpu_serve_bench.py --out "$OUT/gsb" --total 380 \
  --stages install,artifact,step,cold,warm,load --levels 1,8,64,256 \
  --caps "install=60,artifact=120,step=100,cold=110,compiled=100,warm=60,level=45" \
  > "$OUT/gsb.out" 2>&1
stamp "serve-bench rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
rm -rf /tmp/gsb  # the 8B artifact: room on the device's disk
export PYTHONPATH=.:benchmarks:/tmp/site XLA_PYTHON_CLIENT_PREALLOCATE=false
stamp gemma
timeout $(( 585 - ($(date +%s) - t0) )) python3 benchmarks/hybrid_bench.py --presets gemma4-31b \
  --batches 1,8 --json > "$OUT/gemma-31b.jsonl" 2> "$OUT/gemma-31b.log"
stamp "gemma rc=$? $(wc -l < "$OUT/gemma-31b.jsonl") records"
stamp done
