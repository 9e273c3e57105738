#!/bin/bash
# Run 61 (prepared 2026-12-07, fourteenth session): one call that makes the most of whichever
# card comes. On an H200: issue 11's 35B-A3B at 1 / 8 rows with the default kernels (its 300
# tok/s is an H200 figure; 273.4 on an H100 in run 58) and with the expert GEMV on the tensor
# cores (NINFER_MOE_GEMV_DOT=1, timing only), then issue 10's live 8B server
# (run 53b's stages: step, cold and warm start, 1 / 8 / 64 / 256 streams, interference; last
# measured on an H200 in run 49). On any other card: run 60 (the expert GEMV on the tensor
# cores, A/B), which does not need an H200.
# From the repository root, carry [".whl"]; one call, at most ~560 s:
#   bash benchmarks/results/run61/device_run61.sh
FINAL=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$FINAL/gpu.txt"
grep -q H200 "$FINAL/gpu.txt" || exec bash benchmarks/results/run60/device_run60.sh
export OUT=/tmp/o61; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
save() { tar czf "$FINAL/run61.tgz" -C /tmp o61; }
moe35() {  # moe35 NAME [ENV=VALUE ...]: the 35B-A3B's step at 1 / 8 rows
  local name=$1; shift
  stamp "$name"
  env XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 "$@" timeout 100 python3 benchmarks/hybrid_bench.py \
    --json --presets qwen3.6-35b-a3b --no-gdn --batches 1,8 > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
  stamp "$name rc=$?"
  grep '"decode"' "$OUT/$name.jsonl" | cut -c1-220 | tee -a "$OUT/stages.log"; save
}
moe35 moe35
moe35 moe35-dot NINFER_MOE_GEMV_DOT=1
stamp live
left=$(( 560 - $(date +%s) + t0 ))
timeout $left python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b --total $(( left - 5 )) \
  --stages install,artifact,step,cold,warm,load,interference --out "$OUT/gsb" > "$OUT/gsb.out" 2>&1
stamp "live rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
save; ls -la "$OUT"
