#!/bin/bash
# Run 30 (2026-12-04): issue 10's live 8B server at C = 1/8/64/256 on main as it stands (run 29
# ran out of its call before the load levels), cold and warm start with the checksums hashed in
# parallel beside the restore (run 29: warm restart 34.3 s, of which ~15 s sequential SHA-256),
# where the load's seconds go (startup_probe.py), then issue 19's GLM-4.5-Air shape cut to 20
# of its 46 layers (its bf16 weights, ~200 GB, outgrow one GPU) through JaxRunner.
# From the repository root, carry [".whl"]: bash benchmarks/results/run30/device_run30.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
stamp serve-bench
timeout 410 python3 benchmarks/gpu_serve_bench.py --out "$OUT/gsb" --total 400 \
  --stages install,artifact,cold,warm,load --levels 1,8,64,256 \
  --caps "install=60,artifact=100,cold=90,compiled=20,warm=60,level=45" \
  > "$OUT/gsb.out" 2>&1
stamp "serve-bench rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
export PYTHONPATH=.:benchmarks:/tmp/site XLA_PYTHON_CLIENT_PREALLOCATE=false
stamp startup-probe
timeout 90 python3 benchmarks/startup_probe.py /tmp/gsb/qwen3-8b.ninfer --json \
  > "$OUT/startup.jsonl" 2> "$OUT/startup.log"
stamp "startup-probe rc=$?"; cat "$OUT/startup.jsonl" | tee -a "$OUT/stages.log"
rm -rf /tmp/gsb
stamp glm
timeout $(( 585 - ($(date +%s) - t0) )) python3 benchmarks/hybrid_bench.py --presets glm4.5-air \
  --layers 20 --batches 1,8 --json > "$OUT/glm-air-20l.jsonl" 2> "$OUT/glm-air-20l.log"
stamp "glm rc=$? $(wc -l < "$OUT/glm-air-20l.jsonl") records"
stamp done
