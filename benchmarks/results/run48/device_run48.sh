#!/bin/bash
# Run 48 (2026-12-06, seventh session): the shapes an 80 GB H100 could not hold before
# hybrid_bench made its random weights already joined (the runner had held both layouts of
# the 27B's projections: ~87 GB) and raised XLA's allocator limit from its default 75% of the
# card: Gemma 4 31B at batch 1 / 8 (issue 19) and the Qwen3.5-27B at 1 / 8 / 64 (issue 11).
# From the repository root, carry [".whl"]; one call (~520 s):
#   bash benchmarks/results/run48/device_run48.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o48; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
H="python3 benchmarks/hybrid_bench.py --json"
stamp gemma-main
timeout 210 $H --presets gemma4-31b --batches 1,8 > "$OUT/gemma-main.jsonl" 2> "$OUT/gemma-main.log"
stamp "gemma-main rc=$?"; tail -n 3 "$OUT/gemma-main.log" | tee -a "$OUT/stages.log"
stamp hybrid27
left=$(( 540 - $(date +%s) + t0 ))
timeout $left $H --presets qwen3.5-27b --batches 1,8,64 --no-gdn > "$OUT/hybrid27.jsonl" \
  2> "$OUT/hybrid27.log"
stamp "hybrid27 rc=$?"; tail -n 3 "$OUT/hybrid27.log" | tee -a "$OUT/stages.log"
cat "$OUT"/*.jsonl
tar czf "$FINAL/run48.tgz" -C /tmp o48 && ls -la "$OUT"
