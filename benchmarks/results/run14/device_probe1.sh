#!/bin/bash
# Device call of 2026-12-02 (session 2), run 14: where the launch's host time goes, and an
# A/B of XLA's Triton GEMMs against cuBLAS. Each stage under its own cap; logs in $OUT.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=.:benchmarks:/tmp/site PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jcache
A=/tmp/a/qwen3-8b.ninfer
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
stamp artifact; timeout 120 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b $A --force \
  > "$OUT/artifact.log" 2>&1; stamp "artifact rc=$?"
TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3,command_buffer_cmd=3,command_executor=3 \
  timeout 150 python3 benchmarks/launch_probe.py $A --batches 1,64 --calls 40 --json \
  > "$OUT/probe.jsonl" 2> "$OUT/probe.err"; stamp "probe rc=$?"
cat "$OUT/probe.jsonl"
grep -o "Updated command buffer in [0-9]* .*" "$OUT/probe.err" | head -3
grep -c "Updated command buffer in" "$OUT/probe.err"
grep -o "updated_allocs=[0-9]*" "$OUT/probe.err" | sort | uniq -c | head
gzip -f "$OUT/probe.err"
for variant in default notriton; do
  flags=""; [ $variant = notriton ] && flags="--xla_gpu_enable_triton_gemm=false"
  XLA_FLAGS="$flags" timeout 170 python3 benchmarks/runner_bench.py $A --batches 1,8,64,256 \
    --context 384 --prompt 256 --steps 32 --json > "$OUT/rb-$variant.jsonl" 2> "$OUT/rb-$variant.err"
  stamp "runner_bench $variant rc=$?"
  grep -h '"op"' "$OUT/rb-$variant.jsonl" | python3 -c '
import json,sys
for l in sys.stdin:
    d=json.loads(l); print(d.get("op"), d.get("mode"), d.get("batch"), round(d.get("tok_per_s",0),1), d.get("ms_per_step"), d.get("launch_ms"))'
  tail -c 3000 "$OUT/rb-$variant.err" > "$OUT/rb-$variant.errtail"; rm -f "$OUT/rb-$variant.err"
done
stamp done
