#!/bin/bash
# Run 19 (2026-12-02): the live 8B server with the paged decode merge as committed (merge kernel
# past 8 context splits, XLA merge below); bare step at the server's max context 4096.
# From the repository root: bash benchmarks/results/run19/device_run19.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
stamp serve-bench
timeout 420 python3 benchmarks/gpu_serve_bench.py --out "$OUT/gsb" --total 410 \
  --stages install,artifact,step,warm,load \
  --runner-args "--batches 1,8,64 --context 384 --prompt 256 --steps 32 --json --max-context 4096" \
  > /tmp/gsb.out 2>&1
stamp "serve-bench rc=$?"; sed -n '/^stage  /,$p' /tmp/gsb.out | tee -a "$OUT/stages.log"
stamp done
