#!/bin/bash
# Run 16 (2026-12-02): the live 8B server with fused projections and stable buffers, the
# stable-against-plain launch A/B, the 35B-A3B batch-1 decode without a padding row, and the
# 27B hybrid shape. From the repository root: bash benchmarks/results/run16/device_run16.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
stamp serve-bench
timeout 330 python3 benchmarks/gpu_serve_bench.py --out "$OUT/gsb" --total 320 \
  --stages install,artifact,step,warm,load,interference > /tmp/gsb.out 2>&1
stamp "serve-bench rc=$?"; sed -n '/^stage  /,$p' /tmp/gsb.out | tee -a "$OUT/stages.log"
export PYTHONPATH=.:benchmarks:/tmp/site JAX_COMPILATION_CACHE_DIR=/tmp/jcache
timeout 70 python3 benchmarks/runner_bench.py /tmp/gsb/qwen3-8b.ninfer --batches 1,8,64 \
  --context 384 --prompt 256 --steps 32 --json --plain-launch > "$OUT/runner-plain.jsonl" 2>/tmp/rb.err
stamp "runner_bench plain rc=$?"; tail -2 /tmp/rb.err
python3 - "$OUT/runner-plain.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("mode") != "sync":
        print("plain", d["op"], d.get("batch"), round(d["tok_per_s"], 1), d.get("launch_ms"))
PY
rm -rf /tmp/gsb /tmp/jcache
export XLA_PYTHON_CLIENT_PREALLOCATE=false
left=$(( 585 - ($(date +%s) - t0) ))
timeout $(( left > 100 ? 100 : left )) python3 benchmarks/hybrid_bench.py --presets qwen3.6-35b-a3b \
  --batches 1 --prompt 1024 --json >> "$OUT/hybrid.jsonl" 2> /tmp/h35.log; stamp "35b rc=$?"
tail -c 1500 /tmp/h35.log > "$OUT/hybrid.logtail"
left=$(( 590 - ($(date +%s) - t0) ))
[ $left -gt 60 ] && { timeout $left python3 benchmarks/hybrid_bench.py --presets qwen3.5-27b \
  --batches 1,8 --json >> "$OUT/hybrid.jsonl" 2> /tmp/h27.log; stamp "27b rc=$?";
  tail -c 1500 /tmp/h27.log >> "$OUT/hybrid.logtail"; }
cut -c1-500 "$OUT/hybrid.jsonl"
stamp done
