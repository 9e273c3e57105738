#!/bin/bash
# Run 20 (2026-12-02): where the engine core's host time goes at 64 and 256 live streams
# (py-spy on the core process during each level), the step at 64/256 rows with and without
# stable buffers, and the batch-1 step's kernels (runner_bench --profile).
# From the repository root, carry [".whl"] (py-spy's wheel included):
#   bash benchmarks/results/run20/device_run20.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
SPY=/tmp/site/bin/py-spy
RES="$OUT/gsb/results.jsonl"

spy_levels() {  # one py-spy recording per load level: from the level's start to its record
  until [ -f "$RES" ] && grep -q compiled_wait_s "$RES"; do sleep 0.5; done
  for c in 64 256; do
    pid=$(pgrep -f spawn_main | head -1)
    [ -z "$pid" ] && { stamp "no core pid"; return; }
    $SPY record --pid "$pid" --rate 200 --nonblocking --idle --threads --format raw \
      -o "$OUT/spy-c$c.txt" --duration 120 >"$OUT/spy-c$c.log" 2>&1 &
    spy=$!
    until grep -q "\"concurrency\": $c," "$RES"; do sleep 0.2; done
    kill -INT $spy; wait $spy; stamp "spy c=$c done rc=$?"
  done
}

stamp serve-bench
spy_levels &
watcher=$!
timeout 330 python3 benchmarks/gpu_serve_bench.py --out "$OUT/gsb" --total 320 \
  --stages install,artifact,warm,load --levels 64,256 --min-requests 512 \
  > /tmp/gsb.out 2>&1
stamp "serve-bench rc=$?"; sed -n '/^stage  /,$p' /tmp/gsb.out | tee -a "$OUT/stages.log"
kill $watcher 2>/dev/null
export PYTHONPATH=.:benchmarks:/tmp/site XLA_PYTHON_CLIENT_PREALLOCATE=false
ART=/tmp/gsb/qwen3-8b.ninfer
for sb in "" "--stable-buffers"; do
  stamp "step 64,256 $sb"
  timeout 150 python3 benchmarks/runner_bench.py $ART --batches 64,256 --context 384 --prompt 256 \
    --steps 32 --json --max-context 1024 $sb >> "$OUT/step.jsonl" 2>>"$OUT/step.log"
  stamp "rc=$?"
done
stamp "profile b1"
timeout 120 python3 benchmarks/runner_bench.py $ART --batches 1 --context 384 --prompt 256 \
  --steps 32 --json --max-context 1024 --profile /tmp/prof >> "$OUT/profile.jsonl" 2>>"$OUT/profile.log"
stamp "rc=$?"
stamp done
