#!/bin/bash
# Run 22 (2026-12-02): paged decode tiles for many short rows (64 / 256 rows x 384 tokens in a
# 1k table): kernel_bench.py rows. From the repository root: bash benchmarks/results/run22/device_run22.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 300 python3 benchmarks/kernel_bench.py rows > "$OUT/kbench.log" 2>&1
echo "rc=$?"
