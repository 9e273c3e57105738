#!/bin/bash
# Run 53b (prepared 2026-12-07, eleventh session, for an H200): issue 10's live 8B server at
# 1 / 8 / 64 / 256 streams against its bare step, fresh start, restart and the interference
# stage (run 51's stages; run 51 ran them on an H100 at 71bdf8a).
# From the repository root, carry [".whl"]; one call, at most ~560 s:
#   bash benchmarks/results/run53/device_run53b.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o53b; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp live
left=$(( 560 - $(date +%s) + t0 ))
timeout $left python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b --total $(( left - 5 )) \
  --stages install,artifact,step,cold,warm,load,interference --out "$OUT/gsb" > "$OUT/gsb.out" 2>&1
stamp "live rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
tar czf "$FINAL/run53b.tgz" -C /tmp o53b && ls -la "$OUT"
