#!/bin/bash
# Run 48b, on run 48's machine: Gemma 4 31B at batch 8 alone (its batch-8 compile in run 48
# asked 2.64 GiB more for the autotuner's copy of the LM head at the 0.95 limit) and the
# Qwen3.6-35B-A3B at 1 / 8 (issue 11), both at XLA_PYTHON_CLIENT_MEM_FRACTION=0.97.
#   bash benchmarks/results/run48/device_run48b.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o48b; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.97
H="python3 benchmarks/hybrid_bench.py --json"
stamp gemma8
timeout 150 $H --presets gemma4-31b --batches 8 > "$OUT/gemma8.jsonl" 2> "$OUT/gemma8.log"
stamp "gemma8 rc=$?"; tail -n 2 "$OUT/gemma8.log" | cut -c1-300 | tee -a "$OUT/stages.log"
stamp moe35
timeout 250 $H --presets qwen3.6-35b-a3b --batches 1,8 --no-gdn > "$OUT/moe35.jsonl" \
  2> "$OUT/moe35.log"
stamp "moe35 rc=$?"; tail -n 2 "$OUT/moe35.log" | cut -c1-300 | tee -a "$OUT/stages.log"
cat "$OUT"/*.jsonl
tar czf "$FINAL/run48b.tgz" -C /tmp o48b && ls -la "$OUT"
