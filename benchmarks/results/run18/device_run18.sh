#!/bin/bash
# Run 18 (2026-12-02): the paged decode merge that reads only the splits holding keys.
# Native kernel tests; the live 8B server (bare step measured at the server's max context
# 4096); the bare step at 1 / 8 / 64 rows with the kernel before the change at max context
# 4096 and 512, for the A/B. From the repository root: bash benchmarks/results/run18/device_run18.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=.:benchmarks:/tmp/site
if [ -z "$SKIP_PYTEST" ]; then stamp pytest
timeout 120 python3 -m pytest -rA -q -p no:cacheprovider tests/kernels/test_paged_attention.py \
  tests/kernels/test_ragged_attention.py > "$OUT/pytest-gpu-kernels.log" 2>&1
stamp "pytest rc=$?"; tail -3 "$OUT/pytest-gpu-kernels.log"; fi
stamp serve-bench
timeout 360 python3 benchmarks/gpu_serve_bench.py --out "$OUT/gsb" --total 350 \
  --stages install,artifact,step,warm,load \
  --runner-args "--batches 1,8,64 --context 384 --prompt 256 --steps 32 --json --max-context 4096" \
  > /tmp/gsb.out 2>&1
stamp "serve-bench rc=$?"; sed -n '/^stage  /,$p' /tmp/gsb.out | tee -a "$OUT/stages.log"
export JAX_COMPILATION_CACHE_DIR=/tmp/jcache
bench() {  # label max_context
  left=$(( 560 - ($(date +%s) - t0) ))
  [ $left -lt 40 ] && { stamp "skip $1 (no time)"; return; }
  timeout $(( left > 75 ? 75 : left )) python3 benchmarks/runner_bench.py /tmp/gsb/qwen3-8b.ninfer \
    --batches 1,8,64 --context 384 --prompt 256 --steps 32 --json --max-context $2 \
    > "$OUT/runner-$1.jsonl" 2>/tmp/rb.err
  stamp "runner_bench $1 rc=$?"; tail -2 /tmp/rb.err
  python3 - "$OUT/runner-$1.jsonl" "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("mode") == "pipelined":
        print(sys.argv[2], d["batch"], round(d["tok_per_s"], 1), round(d["ms_per_step"], 3))
PY
}
bench after-512 512
cp ninfer_jax/kernels/paged_attention/kernel.py /tmp/kernel_after.py
cp benchmarks/results/run18/kernel_before.py ninfer_jax/kernels/paged_attention/kernel.py
bench before-4096 4096
bench before-512 512
cp /tmp/kernel_after.py ninfer_jax/kernels/paged_attention/kernel.py
stamp done
