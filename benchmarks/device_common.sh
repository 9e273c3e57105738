# Sourced by the device scripts (benchmarks/results/runNN/device_runNN.sh), from the
# repository root on the device machine: $OUT, the stage stamps, the carried wheels installed
# once per machine into /tmp/site, the import path and a compile cache that lives while the
# machine stays warm; `show FILE` prints the decode figures of a runner_bench or
# hybrid_bench JSON file; `artifact_8b` makes /tmp/q8.ninfer (random Qwen3-8B) once per machine.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
[ -d /tmp/site/falcon ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:benchmarks:/tmp/site JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
show() {  # show FILE: each decode record's figures, one line
  python3 -c 'import json, sys
for r in (json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")):
    if r.get("op") == "decode":
        print({k: r[k] for k in ("batch", "padded_rows", "tok_per_s", "ms_per_step",
                                 "tokens_digest") if k in r})' "$1" | tee -a "$OUT/stages.log"
}
artifact_8b() {  # the random Qwen3-8B artifact at /tmp/q8.ninfer, made once per machine
  [ -f /tmp/q8.ninfer/metadata.json ] && return
  stamp artifact
  timeout 90 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b /tmp/q8.ninfer \
    --force > "$OUT/artifact.log" 2>&1
  stamp "artifact rc=$?"
}
