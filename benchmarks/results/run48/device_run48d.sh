#!/bin/bash
# Run 48c, on run 48's machine: the Qwen3.6-35B-A3B at batch 1 without the padding row
# (--min-rows 1: the GPU runner pads a lone decode row to 2, whose routing reads ~8 more
# experts a layer) and under the profiler (kernels per step), for issue 11's 300 tok/s.
#   bash benchmarks/results/run48/device_run48d.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o48d; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.97
stamp moe35prof
timeout 240 python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --batches 1 \
  --no-gdn --profile /tmp/prof > "$OUT/moe35prof.jsonl" 2> "$OUT/moe35prof.log"
stamp "moe35prof rc=$?"; tail -n 2 "$OUT/moe35prof.log" | cut -c1-300 | tee -a "$OUT/stages.log"
cat "$OUT"/*.jsonl | cut -c1-3000
tar czf "$FINAL/run48d.tgz" -C /tmp o48d && ls -la "$OUT"
