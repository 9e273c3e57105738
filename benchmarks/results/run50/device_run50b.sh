#!/bin/bash
# Run 50b (2026-12-07, tenth session): where a 64- and a 256-row decode round of the 8B
# server's own engine goes on the device (benchmarks/engine_round_bench.py --profile; run
# 50's first try waited for every background compile and ran out of time), then with the
# time left issue 14's int8 W8A8 through JaxRunner and the live server at 1 / 8 streams.
# From the repository root, carry [".whl"]; one call, at most ~330 s:
#   bash benchmarks/results/run50/device_run50b.sh
. benchmarks/device_common.sh
END=330
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp artifact
timeout 70 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b --quiet /tmp/bf16.ninfer \
  > "$OUT/artifact.log" 2>&1
stamp "artifact rc=$?"
stamp rounds
timeout 130 python3 benchmarks/engine_round_bench.py /tmp/bf16.ninfer --rows 64,256 --rounds 100 \
  --profile > "$OUT/rounds.log" 2>&1
stamp "rounds rc=$?"; grep '^{' "$OUT/rounds.log" | tee -a "$OUT/stages.log"
rm -rf /tmp/bf16.ninfer
left=$(( END - $(date +%s) + t0 ))
[ $left -lt 120 ] && { stamp "no time for int8"; exit 0; }
stamp int8-artifact
timeout 60 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b --weights int8 --quiet \
  /tmp/int8.ninfer > "$OUT/int8-artifact.log" 2>&1
stamp "int8-artifact rc=$?"
left=$(( END - $(date +%s) + t0 ))
timeout $left python3 benchmarks/gpu_serve_bench.py --artifact /tmp/int8.ninfer --total $(( left - 5 )) \
  --stages install,step,warm,load --levels 1,8 --work /tmp/gsb8 \
  --runner-args "--batches 1,8 --context 384 --prompt 256 --steps 32 --max-context 4096 --json" \
  --out "$OUT/gsb-int8" > "$OUT/gsb-int8.out" 2>&1
stamp "live-int8 rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb-int8.out" | tee -a "$OUT/stages.log"
