#!/bin/bash
# Run 44 (prepared 2026-12-06, fifth session): several prompts' chunks in one step
# (JaxRunner chunk_segments, 8 x 256 tokens by default on GPUs). From the repository root,
# carry [".whl"]:  bash benchmarks/results/run44/device_run44.sh
#   tests   the segmented chunk attention (cuDNN batched two-part prefill) and the runner's
#           segmented steps against one chunk per step, on the GPU (-m gpu)
#   live    the live 8B server at 1 / 8 / 64 / 256 against the step (gpu_serve_bench), now
#           with segments: does c64 (3,528 tok/s on an H100 in run 41, admission-bound) rise?
#   ab      the 64 level again with --chunk-segments 1 (one chunk per step), same machine
# Everything goes to /tmp/o44, tarred into $OUT/run44.tgz.
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o44; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp tests
timeout 150 python3 -m pytest -rA -p no:cacheprovider -m gpu tests/kernels/test_ragged_attention.py \
  tests/model/test_runner_chunk_segments.py > "$OUT/pytest-segments.log" 2>&1
stamp "tests rc=$?"; tail -n 3 "$OUT/pytest-segments.log" | tee -a "$OUT/stages.log"
stamp live
timeout 330 python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b --total 320 \
  --stages install,artifact,step,warm,load --out "$OUT/gsb" > "$OUT/gsb.out" 2>&1
stamp "live rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
grep -h "slow step submit\|segment\|compiling step shape" "$OUT"/gsb/server-*.log | head -20 \
  | tee -a "$OUT/stages.log"
left=$(( 560 - ($(date +%s) - t0) ))
if [ "$left" -gt 100 ]; then
  stamp "ab (left ${left}s)"
  timeout $(( left - 10 )) python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b \
    --total $(( left - 15 )) --stages warm,load --levels 64 --out "$OUT/ab" \
    --serve-args "--max-concurrency 256 --max-context 4096 --http-threads 320 --chunk-segments 1" \
    > "$OUT/ab.out" 2>&1
  stamp "ab rc=$?"; sed -n '/^stage  /,$p' "$OUT/ab.out" | tee -a "$OUT/stages.log"
fi
tar czf "$FINAL/run44.tgz" -C /tmp o44 && ls -la "$OUT"
