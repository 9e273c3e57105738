#!/bin/bash
# One device call: native kernel tests, then benchmark stages, each under its own time cap so
# one stall cannot eat the call. Usage: benchmarks/device_run.sh STAGE[:ARGS][@SECONDS] ...
#   tests              pytest tests/kernels natively on the GPU
#   kbench:SECTIONS    benchmarks/kernel_bench.py SECTIONS (comma separated)
#   engine:ARGS        benchmarks/engine_bench.py ARGS (commas inside ARGS kept; '+' = space)
#   serve:ARGS         benchmarks/gpu_serve_bench.py ARGS ('+' = space), its --total 10 s
#                      under the stage's cap; it installs the carried .whl/ itself
# Logs and JSON lines land in $OUT.
export PYTHONPATH=.:benchmarks PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c 'import jax; print(jax.__version__, jax.devices())' 2>&1 | tail -1
for spec in "$@"; do
  body=${spec%@*}; cap=${spec##*@}; [ "$cap" = "$spec" ] && cap=120
  stage=${body%%:*}; arg=${body#*:}; [ "$arg" = "$body" ] && arg=
  start=$(date +%s)
  case $stage in
    tests) timeout "$cap" python3 -m pytest tests/kernels -q -p no:cacheprovider \
             >"$OUT/pytest.log" 2>&1; echo "tests rc=$? $(tail -1 "$OUT/pytest.log")";;
    kbench) timeout "$cap" python3 benchmarks/kernel_bench.py ${arg//,/ } >>"$OUT/kbench.log" 2>&1
            echo "kbench $arg rc=$?";;
    engine) timeout "$cap" python3 benchmarks/engine_bench.py ${arg//+/ } >>"$OUT/engine.log" 2>&1
            echo "engine $arg rc=$?";;
    serve) timeout "$cap" python3 benchmarks/gpu_serve_bench.py --total $((cap - 10)) \
             ${arg//+/ } >>"$OUT/serve.log" 2>&1; echo "serve $arg rc=$?"
           sed -n '/^stage  /,$p' "$OUT/serve.log";;
  esac
  echo "  took $(( $(date +%s) - start ))s"
done
