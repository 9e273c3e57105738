#!/bin/bash
# Run 52d (2026-12-07, eleventh session): kernel_bench's `moe` section (run 52c's try
# compiled the expert weights into the executable as constants: now they are arguments).
# From the repository root, carry [".whl"]; one call, at most ~200 s:
#   bash benchmarks/results/run52/device_run52d.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o52d; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
export PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp moe-kernels
timeout -s ABRT 180 python3 benchmarks/kernel_bench.py moe > "$OUT/kernel-moe.log" 2>&1
stamp "moe-kernels rc=$?"; grep -v "^moe: " "$OUT/kernel-moe.log" | tail -n 12 | cut -c1-300 \
  | tee -a "$OUT/stages.log"
tar czf "$FINAL/run52d.tgz" -C /tmp o52d && ls -la "$OUT"
