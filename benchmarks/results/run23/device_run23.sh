#!/bin/bash
# Run 23 (2026-12-02): 8-bit KV pages (fp8, int8) and the host tier on the H200: native
# kernel tests and the JaxRunner page-copy exactness test, the decode kernel over bf16 /
# fp8 / int8 pages (kernel_bench.py kv8), and the 8B step at 64 and 256 rows per KV dtype.
# From the repository root, carry [".whl"]: bash benchmarks/results/run23/device_run23.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:benchmarks:/tmp/site JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
stamp pytest
timeout 200 python3 -m pytest -rA -p no:cacheprovider tests/kernels/test_fp8_pages.py \
  tests/kernels/test_paged_attention.py "tests/engine/test_context_cache_exact.py" -k "not default" \
  > "$OUT/pytest-gpu.log" 2>&1
stamp "pytest rc=$? $(tail -1 "$OUT/pytest-gpu.log")"
stamp kbench
timeout 120 python3 benchmarks/kernel_bench.py kv8 > "$OUT/kbench.log" 2>&1
stamp "kbench rc=$?"
ART=/tmp/gsb/qwen3-8b.ninfer
( [ -f $ART/metadata.json ] || timeout 120 python3 -m ninfer_jax.cli.main init-random \
    --preset qwen3-8b $ART --force > /tmp/artifact.log 2>&1 )
stamp "artifact $(tail -1 /tmp/artifact.log 2>/dev/null)"
for kv in auto fp8 int8; do
  stamp "step $kv"
  timeout 100 python3 benchmarks/runner_bench.py $ART --batches 64,256 --context 384 \
    --prompt 256 --steps 32 --json --modes pipelined --max-context 1024 --kv-dtype $kv \
    >> "$OUT/step.jsonl" 2>>/tmp/step.log
  stamp "rc=$? $(tail -1 /tmp/step.log | cut -c1-200)"
done
stamp done
