#!/bin/bash
# Run 26 (2026-12-03: copies in waves, a restore reclaims at once): issue 13's GPU figure through the live server: a cached 32k-token
# prompt restored from the pinned host tier against recomputing it (qwen3-8b shape, random
# weights), then the host-tier exactness test natively.
# From the repository root, carry [".whl"]: bash benchmarks/results/run26/device_run26.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:benchmarks:/tmp/site JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp copies
timeout 90 python3 benchmarks/host_copy_bench.py --rows 256 --row-mib 2.25 > "$OUT/host_copy.jsonl" 2>&1
stamp "copies rc=$? $(cat "$OUT/host_copy.jsonl" | tr '\n' ' ')"
stamp bench
timeout 380 python3 benchmarks/host_restore_bench.py --preset qwen3-8b --out "$OUT" --total 370
stamp "bench rc=$?"
stamp pytest
timeout $(( 585 - ($(date +%s) - t0) )) python3 -m pytest -rA -p no:cacheprovider \
  tests/engine/test_page_store.py tests/engine/test_context_cache_exact.py tests/model/test_hybrid_engine.py -k "not default and (snapshot or exact or page or store or held or bytes)" > "$OUT/pytest-gpu.log" 2>&1
stamp "pytest rc=$? $(tail -1 "$OUT/pytest-gpu.log")"
