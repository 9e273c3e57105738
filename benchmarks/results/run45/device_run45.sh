#!/bin/bash
# Run 45 (prepared 2026-12-06, fifth session; redone in the sixth): the live 8B server with
# chunk segments at every level, the measurement run 44 could not finish (its 64 level was cut
# by the script's own budget, the 256 level never ran), now also with the host tier's pinned
# memory taken at start-up (runner.use_host_tier), its copy shapes compiled off the engine
# thread and the auto pool kept across restarts (serve/kv_sizing.keep_last_pool). From the
# repository root, carry [".whl"]; one call:
#   bash benchmarks/results/run45/device_run45.sh
# ~540 s on an H100 or H200: GPU tests (segments, pinned reservation), the pinned-pool probe,
# then gpu_serve_bench: install, artifact (~50 s), step (~70 s), cold start + background
# compile (~175 s), the restart (warm), levels 1 / 8 / 64 / 256 (~100 s).
# Everything goes to /tmp/o45, tarred into $OUT/run45.tgz.
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o45; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp tests
timeout 70 python3 -m pytest -rA -p no:cacheprovider -m gpu tests/model/test_chunk_segments_gpu.py \
  tests/engine/test_page_store.py > "$OUT/pytest-gpu.log" 2>&1
stamp "tests rc=$?"; tail -n 2 "$OUT/pytest-gpu.log" | tee -a "$OUT/stages.log"
stamp probe
timeout 40 python3 benchmarks/pinned_probe.py --json --bursts 64,256 --repeats 2 \
  > "$OUT/probe-default.jsonl" 2>&1
stamp "probe rc=$?"; cat "$OUT/probe-default.jsonl" | tee -a "$OUT/stages.log"
stamp live
left=$(( 575 - $(date +%s) + t0 ))
timeout $left python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b --total $(( left - 5 )) \
  --stages install,artifact,step,cold,warm,load --out "$OUT/gsb" > "$OUT/gsb.out" 2>&1
stamp "live rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
grep -h "slow step submit\|pinned host memory\|copy shapes\|KV pool bound" "$OUT"/gsb/server-*.log \
  | head -40 >> "$OUT/stages.log"
tar czf "$FINAL/run45.tgz" -C /tmp o45 && ls -la "$OUT"
