#!/bin/bash
# Run 28 (2026-12-03): the vision tower's encode time on the H200 (issue 17), the AVX-512 VNNI
# path of the CPU block kernel on the device host's CPU (issue 15's folded row loop), and the
# native GPU tests of the Gemma 4 and multimodal forwards.
# From the repository root, carry [".whl"]: bash benchmarks/results/run28/device_run28.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:benchmarks:/tmp/site JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
grep -m1 "model name" /proc/cpuinfo | tee -a "$OUT/stages.log"
grep -o -m1 "avx512_vnni" /proc/cpuinfo | head -1 | tee -a "$OUT/stages.log"
python3 -c "import transformers; print('transformers', transformers.__version__)" 2>&1 | tail -1 | tee -a "$OUT/stages.log"
stamp vision
timeout 200 python3 benchmarks/vision_encode_bench.py --sizes 448 896 1344 --out "$OUT" 2>&1 | tail -5 | tee -a "$OUT/stages.log"
stamp "vision rc=$?"
stamp cpu-kernel
(timeout 120 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 && \
 timeout 120 python3 -m pytest -rA -p no:cacheprovider tests/kernels/test_ggml_matmul.py > "$OUT/pytest-cpu-kernel.log" 2>&1)
stamp "cpu-kernel rc=$? $(tail -1 "$OUT/pytest-cpu-kernel.log" 2>/dev/null)"
stamp pytest-gpu
timeout $(( 560 - ($(date +%s) - t0) )) python3 -m pytest -rA -p no:cacheprovider \
  tests/model/test_gemma_vs_transformers.py tests/kernels/test_window_attention.py \
  tests/model/test_multimodal_vs_transformers.py > "$OUT/pytest-gpu.log" 2>&1
stamp "pytest-gpu rc=$? $(tail -1 "$OUT/pytest-gpu.log")"
