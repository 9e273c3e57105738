#!/bin/bash
# Issue 10's restart (not run yet; the lead numbers it): the weight load as a pipeline of parts
# (engine/weight_pipeline.py). Cold and warm start of the 8B server through gpu_serve_bench
# (warm restart: 23.8 s in run 30, target <= 20 s), then startup_probe.py on the same artifact:
# each phase alone, the old sequential load against the pipelined one per workers x part size
# (each checked bit-identical on the device), transfer variants (threads, via pinned host),
# then pinned_reserve_probe.py (would reserving the host tier's pinned memory help?).
# From the repository root, carry [".whl"]: bash benchmarks/results/startup-pipeline/device_run.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
stamp serve-bench
timeout 320 python3 benchmarks/gpu_serve_bench.py --out "$OUT/gsb" --total 310 \
  --stages install,artifact,cold,warm \
  --caps "install=60,artifact=130,cold=90,compiled=30,warm=60" > "$OUT/gsb.out" 2>&1
stamp "serve-bench rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
export PYTHONPATH=.:benchmarks:/tmp/site XLA_PYTHON_CLIENT_PREALLOCATE=false
stamp startup-probe
timeout $(( 530 - ($(date +%s) - t0) )) python3 benchmarks/startup_probe.py \
  /tmp/gsb/qwen3-8b.ninfer --json --workers 6,4,12 --part-mib 256,1024 \
  > "$OUT/startup.jsonl" 2> "$OUT/startup.log"
stamp "startup-probe rc=$?"; cat "$OUT/startup.jsonl" | tee -a "$OUT/stages.log"
rm -rf /tmp/gsb
stamp pinned-probe
timeout $(( 590 - ($(date +%s) - t0) )) python3 benchmarks/pinned_reserve_probe.py --mib 8192 \
  --json > "$OUT/pinned.jsonl" 2> "$OUT/pinned.log"
stamp "pinned-probe rc=$?"; cat "$OUT/pinned.jsonl" | tee -a "$OUT/stages.log"
stamp done
