#!/bin/bash
# Run 55b (2026-12-07, twelfth session): the first stages of run 55 alone, for a lease with
# little device time left: issue 11's 35B-A3B through JaxRunner at 1 / 8 / 64 rows, then its
# 1- and 8-row steps under the profiler with each kernel's source lines.
# From the repository root, carry [".whl"]; one call, at most ~230 s:
#   bash benchmarks/results/run55/device_run55b.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o55b; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
H="python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --no-gdn"
stamp moe35
XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 timeout 110 $H --batches 1,8,64 > "$OUT/moe35.jsonl" \
  2> "$OUT/moe35.log"
stamp "moe35 rc=$?"; grep '"decode"' "$OUT/moe35.jsonl" | cut -c1-260 | tee -a "$OUT/stages.log"
tar czf "$FINAL/run55b.tgz" -C /tmp o55b
stamp moe35prof
XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 timeout 100 $H --batches 1,8 --profile /tmp/prof \
  > "$OUT/moe35prof.jsonl" 2> "$OUT/moe35prof.log"
stamp "moe35prof rc=$?"
tar czf "$FINAL/run55b.tgz" -C /tmp o55b && ls -la "$OUT"
