#!/bin/bash
# Run 21 (2026-12-02): the paged decode kernel's split size and merge threshold A/B through
# the bare step (runner_bench, pipelined) at 1 and 8 rows and max context 1024 / 4096, and the
# step's kernels at 64 and 256 rows (runner_bench --profile).
# From the repository root, carry [".whl"]: bash benchmarks/results/run21/device_run21.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:benchmarks:/tmp/site JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
ART=/tmp/gsb/qwen3-8b.ninfer
stamp artifact
[ -f $ART/metadata.json ] || timeout 150 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b $ART --force > "$OUT/artifact.log" 2>&1
stamp "artifact rc=$?"
ab() {  # label, max context, extra flags
  stamp "step $1 ctx $2"
  timeout 100 python3 benchmarks/runner_bench.py $ART --batches 1,8 --context 384 --prompt 256 \
    --steps 48 --json --modes pipelined --max-context $2 "${@:3}" \
    | sed "s/^{/{\"label\": \"$1\", /" >> "$OUT/ab.jsonl" 2>>"$OUT/ab.log"
  stamp "rc=$?"
}
ab default 1024
ab split512 1024 --decode-split-tokens 512
ab xlamerge 1024 --merge-min-splits 65
ab split256 1024 --decode-split-tokens 256
ab default 4096
ab split512 4096 --decode-split-tokens 512
ab xlamerge 4096 --merge-min-splits 65
stamp "profile 64,256"
timeout 150 python3 benchmarks/runner_bench.py $ART --batches 64,256 --context 384 --prompt 256 \
  --steps 16 --json --modes pipelined --max-context 1024 --profile /tmp/prof \
  >> "$OUT/profile.jsonl" 2>>"$OUT/profile.log"
stamp "rc=$?"
stamp done
