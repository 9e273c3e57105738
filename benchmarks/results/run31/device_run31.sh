#!/bin/bash
# Run 31 (2026-12-04): run 27's host-restore bench after write-through (prefix pages get a clean host copy
# at publish, so evicting them moves no bytes and a host hit only loads), with the server's
# default step shapes; then the native tests. The bench now records server-side ttft per
# phase (server.log) and the host hit's bytes each way in its summary.
# From the repository root, carry [".whl"]: bash benchmarks/results/run31/device_run31.sh
# (as run: BENCH_S=250 ROUNDS=2 SKIP_PYTEST=1, the device time left after a helper's call)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:benchmarks:/tmp/site JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp bench
timeout ${BENCH_S:-470} python3 benchmarks/host_restore_bench.py --preset qwen3-8b --out "$OUT" \
  --total $(( ${BENCH_S:-470} - 10 )) ${ROUNDS:+--rounds $ROUNDS}
stamp "bench rc=$?"
[ -n "$SKIP_PYTEST" ] && exit 0
stamp pytest
timeout $(( 575 - ($(date +%s) - t0) )) python3 -m pytest -rA -p no:cacheprovider \
  tests/engine/test_page_store.py tests/engine/test_context_cache_exact.py tests/model/test_hybrid_engine.py -k "not default and (snapshot or exact or page or store or held or bytes or waves)" > "$OUT/pytest-gpu.log" 2>&1
stamp "pytest rc=$? $(tail -1 "$OUT/pytest-gpu.log")"
