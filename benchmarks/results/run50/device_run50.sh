#!/bin/bash
# Run 50 (2026-12-07, tenth session): one call, ~450 s. (1) The PTX nibble decode's native
# tests and int4 through the 8B step with it (device_run49f.sh); (2) issue 10's live 8B
# server (bf16) at 1 / 8 / 64 / 256 streams against its bare step, with the sampled tokens'
# early readback (JaxRunner.launch) and the leaner per-row planning and commit of this
# session (no cold start, no interference: run 49 has those); (3) where a 64- and a 256-row
# round goes with the real runner (benchmarks/engine_round_bench.py --profile); (4) with the
# time left, issue 14's int8 W8A8 through JaxRunner and the live server at 1 / 8 streams.
# From the repository root, carry [".whl"]:
#   bash benchmarks/results/run50/device_run50.sh
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp ptx-tests
timeout 40 python3 -m pytest -rA -p no:cacheprovider -m gpu tests/kernels/test_quant_matmul.py \
  -k "nibble_ptx or halves_layout_on_gpu" > "$OUT/pytest-ptx.log" 2>&1
stamp "ptx-tests rc=$?"; tail -n 2 "$OUT/pytest-ptx.log" | tee -a "$OUT/stages.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-ptx.log" | head | tee -a "$OUT/stages.log"
stamp int4-ptx
timeout 60 python3 benchmarks/engine_bench.py --model qwen3-8b --decode 1x1024,8x1024,64x1024 \
  --no-ceilings --weights int4 --nibble-decode ptx > "$OUT/engine-int4-ptx.log" 2>&1
stamp "int4-ptx rc=$?"; grep '"decode"' "$OUT/engine-int4-ptx.log" | cut -c1-330 | tee -a "$OUT/stages.log"
stamp live-bf16
left=$(( 560 - $(date +%s) + t0 - 130 ))
timeout $left python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b --total $(( left - 5 )) \
  --stages install,artifact,step,warm,load --out "$OUT/gsb" > "$OUT/gsb.out" 2>&1
stamp "live-bf16 rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
grep -h "slow step submit\|KV pool bound" "$OUT"/gsb/server-*.log | head -20 >> "$OUT/stages.log"
stamp rounds
left=$(( 560 - $(date +%s) + t0 )); [ $left -gt 130 ] && left=130
JAX_COMPILATION_CACHE_DIR=/tmp/gsb/jax-cache-serve-qwen3-8b timeout $left \
  python3 benchmarks/engine_round_bench.py /tmp/gsb/qwen3-8b.ninfer --rows 64,256 --rounds 100 \
  --profile --serve-args "--max-concurrency 256 --max-context 4096" > "$OUT/rounds.log" 2>&1
stamp "rounds rc=$?"; grep '^{' "$OUT/rounds.log" | tee -a "$OUT/stages.log"
left=$(( 560 - $(date +%s) + t0 ))
[ $left -lt 110 ] && { stamp "no time for int8"; exit 0; }
rm -rf /tmp/gsb/qwen3-8b.ninfer  # room for the int8 artifact
stamp int8-artifact
timeout 60 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b --weights int8 --quiet \
  /tmp/int8.ninfer > "$OUT/int8-artifact.log" 2>&1
stamp "int8-artifact rc=$?"
left=$(( 560 - $(date +%s) + t0 ))
timeout $left python3 benchmarks/gpu_serve_bench.py --artifact /tmp/int8.ninfer --total $(( left - 5 )) \
  --stages install,step,warm,load --levels 1,8 --work /tmp/gsb8 \
  --runner-args "--batches 1,8 --context 384 --prompt 256 --steps 32 --max-context 4096 --json" \
  --out "$OUT/gsb-int8" > "$OUT/gsb-int8.out" 2>&1
stamp "live-int8 rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb-int8.out" | tee -a "$OUT/stages.log"
