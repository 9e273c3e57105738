#!/bin/bash
# Run 53 (prepared 2026-12-07, eleventh session, for an H200; that session got only H100s):
# (1) issue 11's 35B-A3B through JaxRunner at 1 / 8 / 64 rows with the routed experts'
# activation fusion and the shared-expert fold (run 52e on an H100: 251.5 / 911.5 tok/s at
# 1 / 8); (2) with the time left, issue 10's live 8B server at 1 / 8 / 64 / 256 streams
# against its bare step, cold start, restart and the interference stage (run 51's stages).
# From the repository root, carry [".whl"]; one call, at most ~590 s:
#   bash benchmarks/results/run53/device_run53.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o53; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp moe35
XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 timeout 120 python3 benchmarks/hybrid_bench.py --json \
  --presets qwen3.6-35b-a3b --batches 1,8,64 --no-gdn > "$OUT/moe35.jsonl" 2> "$OUT/moe35.log"
stamp "moe35 rc=$?"; grep '"decode"' "$OUT/moe35.jsonl" | cut -c1-260 | tee -a "$OUT/stages.log"
stamp live
left=$(( 585 - $(date +%s) + t0 ))
timeout $left python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b --total $(( left - 5 )) \
  --stages install,artifact,step,cold,warm,load,interference --out "$OUT/gsb" > "$OUT/gsb.out" 2>&1
stamp "live rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
tar czf "$FINAL/run53.tgz" -C /tmp o53 && ls -la "$OUT"
