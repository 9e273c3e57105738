#!/bin/bash
# Run 52e (2026-12-07, eleventh session): the shared-expert fold (model/fused_projections.py
# FOLD_SHARED_EXPERT, off until timed) against the default, same call, same card: the
# 35B-A3B through JaxRunner at 1 / 8 rows (run 52c: 240.4 / 862.4 tok/s on an H100).
# From the repository root, carry [".whl"]; one call, at most ~200 s:
#   bash benchmarks/results/run52/device_run52e.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o52e; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.97
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
for fold in 1 0; do
  stamp "moe35 fold=$fold"
  NINFER_FOLD_SHARED_EXPERT=$fold timeout 95 python3 benchmarks/hybrid_bench.py --json \
    --presets qwen3.6-35b-a3b --batches 1,8 --no-gdn > "$OUT/moe35-fold$fold.jsonl" \
    2> "$OUT/moe35-fold$fold.log"
  stamp "moe35 fold=$fold rc=$?"; grep '"decode"' "$OUT/moe35-fold$fold.jsonl" | cut -c1-260 \
    | tee -a "$OUT/stages.log"
done
tar czf "$FINAL/run52e.tgz" -C /tmp o52e && ls -la "$OUT"
