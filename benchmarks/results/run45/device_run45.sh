#!/bin/bash
# Run 45 (prepared 2026-12-06, fifth session): the live 8B server with chunk segments at every
# level, the measurement run 44 could not finish (its 64 level was cut by the script's own
# budget, the 256 level never ran). From the repository root, carry [".whl"]; one call:
#   bash benchmarks/results/run45/device_run45.sh
# ~560 s on an H100 or H200: install, artifact (~50 s), step (~70 s), start + background compile
# (~175 s), levels 1 / 8 / 64 / 256 (~60 s), the 4k prompt among 63 streams (~60 s).
# Everything goes to /tmp/o45, tarred into $OUT/run45.tgz.
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o45; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp tests
timeout 60 python3 -m pytest -rA -p no:cacheprovider -m gpu tests/model/test_chunk_segments_gpu.py \
  > "$OUT/pytest-runner-gpu.log" 2>&1
stamp "tests rc=$?"; tail -n 2 "$OUT/pytest-runner-gpu.log" | tee -a "$OUT/stages.log"
stamp live
timeout 490 python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b --total 485 \
  --stages install,artifact,step,warm,load,interference --out "$OUT/gsb" > "$OUT/gsb.out" 2>&1
stamp "live rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
grep -h "slow step submit\|throughput" "$OUT"/gsb/server-*.log | head -40 >> "$OUT/stages.log"
tar czf "$FINAL/run45.tgz" -C /tmp o45 && ls -la "$OUT"
