#!/bin/bash
# Run 55c (2026-12-07, twelfth session, the lease's last ~270 s): on an H200, run 55's
# 35B-A3B stages (ONLY_MOE=1); on an H100, whose 35B-A3B figures run 52 has, only its 1- and
# 8-row steps under the profiler with each kernel's source lines (what fusion work needs).
#   bash benchmarks/results/run55/device_run55c.sh
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  ONLY_MOE=1 exec bash benchmarks/results/run55/device_run55.sh
fi
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o55c; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp moe35prof
XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 timeout 150 python3 benchmarks/hybrid_bench.py --json \
  --presets qwen3.6-35b-a3b --no-gdn --batches 1,8 --profile /tmp/prof \
  > "$OUT/moe35prof.jsonl" 2> "$OUT/moe35prof.log"
stamp "moe35prof rc=$?"
tar czf "$FINAL/run55c.tgz" -C /tmp o55c && ls -la "$OUT"
