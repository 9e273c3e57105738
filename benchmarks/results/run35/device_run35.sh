#!/bin/bash
# Run 35: run 34 again after 7f253e9 (chained verify rows in one WY solve per head); issue 12.
# Same stages as run 34 (see its header): 27B verify K = 1, 3, 7, 15 at batch 1 and 8, then MTP K = 3.
# From the repository root, carry [".whl"]:  bash benchmarks/results/run35/device_run35.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGES=${1:-verify mtp}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
[ -d /tmp/site/falcon ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:benchmarks:/tmp/site JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
B="benchmarks/hybrid_bench.py --presets qwen3.5-27b --prompt 1024 --steps 16 --no-gdn --json"
for stage in $STAGES; do
  stamp "$stage"
  case $stage in
    verify) timeout 330 python3 $B --batches 1,8 --verify 1,3,7,15 > "$OUT/verify-27b.jsonl" \
              2> "$OUT/verify-27b.log";;
    mtp) timeout 230 python3 $B --batches 1 --verify 3 --mtp 3 --mtp-acceptance 64 \
           > "$OUT/mtp-27b.jsonl" 2> "$OUT/mtp-27b.log";;
  esac
  stamp "$stage rc=$?"
done
for f in "$OUT"/verify-27b.log "$OUT"/mtp-27b.log; do tail -c 3000 "$f" > "$f.tail"; rm -f "$f"; done
