#!/bin/bash
# Run 47 (prepared 2026-12-06, seventh session): run 45's call again, for issue 10's H200
# figures (the H200 never came in the sixth session), now with the host tier's pinned
# reservation on a thread beside warm-up (the restart spent 4.4 s of run 45's 20.05 s there)
# and gpu_serve_bench's interference stage (63 streams decoding, then one 4k prompt). From
# the repository root, carry [".whl"]; one call:
#   bash benchmarks/results/run47/device_run47.sh
# ~560 s on an H100 or H200. Everything goes to /tmp/o47, tarred into $OUT/run47.tgz.
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o47; rm -rf "$OUT"; mkdir -p "$OUT"
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
left=$(( 585 - $(date +%s) + t0 ))
timeout $left python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b --total $(( left - 5 )) \
  --stages install,artifact,step,cold,warm,load,interference --out "$OUT/gsb" > "$OUT/gsb.out" 2>&1
stamp "live rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
grep -h "slow step submit\|pinned host memory\|copy shapes\|KV pool bound" "$OUT"/gsb/server-*.log \
  | head -40 >> "$OUT/stages.log"
tar czf "$FINAL/run47.tgz" -C /tmp o47 && ls -la "$OUT"
