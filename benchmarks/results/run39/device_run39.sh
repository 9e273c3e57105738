#!/bin/bash
# Run 39 (2026-12-06): run 38's groups (benchmarks/results/run38/device_run38.sh) plus "lanesref":
# the 8 penalty / policy comparisons marked CPU_EXACT, on the GPU under NINFER_FORCE_REFERENCE=1
# (does only the kernels' rounding separate prefill KV from decode KV?). From the repository
# root, carry [".whl"]: bash benchmarks/results/run39/device_run39.sh "gemma lanesref"
# Everything is written to /tmp/o and tarred into $OUT/run39-<groups>.tgz at the end.
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o; rm -rf "$OUT"; mkdir -p "$OUT"
for g in $1; do
  case $g in
    lanesref)
      . benchmarks/device_common.sh; stamp lanesref
      NINFER_FORCE_REFERENCE=1 timeout 200 python3 -m pytest -rA -p no:cacheprovider \
        tests/model/test_penalty_engine.py tests/model/test_policy_engine.py \
        > "$OUT/pytest-lanesref.log" 2>&1
      stamp "lanesref rc=$?"; tail -n 3 "$OUT/pytest-lanesref.log" | tee -a "$OUT/stages.log";;
    *) bash benchmarks/results/run38/device_run38.sh "$g";;
  esac
done
tar czf "$FINAL/run39-${1// /-}.tgz" -C "$OUT" . && ls -la "$OUT"
