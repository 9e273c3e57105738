#!/bin/bash
# Run 54 (prepared 2026-12-07, twelfth session): issue 14's int8 weights on the 8B shape,
# quantized at load from one bf16 artifact made on the device (runner_bench --weights, as
# `ninfer serve --weights int8`; W8A8 at every row count, the GPU's default): the bare step
# at 1 / 8 / 64 rows against bf16 in the same call, int8's one-row step under the profiler
# with each kernel's source lines, then the live int8 server at 1 and 8 streams.
# From the repository root, carry [".whl"]; one call, at most ~560 s:
#   bash benchmarks/results/run54/device_run54.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o54; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
END=560
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp artifact
timeout 70 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b --quiet /tmp/q8.ninfer \
  > "$OUT/artifact.log" 2>&1
stamp "artifact rc=$?"
R="python3 benchmarks/runner_bench.py /tmp/q8.ninfer --batches 1,8,64 --context 1024 --prompt 256
   --steps 32 --max-context 4096 --modes pipelined --json"
summary() { grep '"decode"' "$1" | python3 -c 'import json,sys
for r in map(json.loads, sys.stdin): print(r["batch"], round(r["ms_per_step"], 3), round(r["tok_per_s"], 1))' \
  | sed "s/^/$2 /" | tee -a "$OUT/stages.log"; }
stamp bf16
timeout 90 $R > "$OUT/bf16.jsonl" 2> "$OUT/bf16.log"; stamp "bf16 rc=$?"; summary "$OUT/bf16.jsonl" bf16
stamp int8
timeout 150 $R --weights int8 --profile /tmp/prof-int8 > "$OUT/int8.jsonl" 2> "$OUT/int8.log"
stamp "int8 rc=$?"; summary "$OUT/int8.jsonl" int8
left=$(( END - $(date +%s) + t0 ))
[ $left -lt 150 ] && { stamp "no time for the live server"; tar czf "$FINAL/run54.tgz" -C /tmp o54; exit 0; }
stamp live-int8
timeout $left python3 benchmarks/gpu_serve_bench.py --artifact /tmp/q8.ninfer --total $(( left - 10 )) \
  --stages install,warm,load --levels 1,8 --work /tmp/gsb54 \
  --serve-args "--max-concurrency 256 --max-context 4096 --http-threads 320 --weights int8" \
  --out "$OUT/gsb-int8" > "$OUT/gsb-int8.out" 2>&1
stamp "live-int8 rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb-int8.out" | tee -a "$OUT/stages.log"
tar czf "$FINAL/run54.tgz" -C /tmp o54 && ls -la "$OUT"
