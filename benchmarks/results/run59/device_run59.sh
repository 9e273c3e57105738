#!/bin/bash
# Run 59 (2026-12-07, thirteenth session): run 58 on an H200 only (issue 11's 300 tok/s is an
# H200 figure; runs 56-58 got H100s). On any other card it stops at once, so a lease that
# brings an H100 costs only its start. The default (fused GDN rows, router kernel) at
# 1 / 8 / 64 rows, then both off at 1 / 8 rows in the same call.
# From the repository root, carry [".whl"]; one call, ~220 s:
#   bash benchmarks/results/run59/device_run59.sh
FINAL=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$FINAL/gpu.txt"
grep -q H200 "$FINAL/gpu.txt" || { echo "not an H200: nothing run"; exit 0; }
END=${END:-240} exec bash benchmarks/results/run58/device_run58.sh
