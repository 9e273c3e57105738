#!/bin/bash
# Run 58 (2026-12-07, thirteenth session): issue 11's 35B-A3B on an H200 with the fused GDN
# rows and the MoE router kernel now on by default (run 57, H100: 252.2 -> 274.8 tok/s at
# batch 1): the new kernels' native tests, the default at 1 / 8 / 64 rows, then both switches
# off at 1 / 8 rows in the same call (the before figure on this card).
# From the repository root, carry [".whl"]; one call, ~330 s (END=S: fewer):
#   bash benchmarks/results/run58/device_run58.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o58; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run58.tgz" -C /tmp o58; }
left() { echo $(( ${END:-400} - $(date +%s) + t0 )); }
H="python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --no-gdn"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.97
stamp moe35-default
timeout 150 $H --batches 1,8,64 > "$OUT/moe35-default.jsonl" 2> "$OUT/moe35-default.log"
stamp "moe35-default rc=$?"
grep '"decode"' "$OUT/moe35-default.jsonl" | cut -c1-200 | tee -a "$OUT/stages.log"; save
if [ $(left) -ge 170 ]; then  # the tests, when the off run still fits after them
  stamp gpu-tests
  timeout 90 python3 -m pytest -rA -m gpu tests/kernels/test_gated_delta.py \
    tests/kernels/test_moe_router.py > "$OUT/pytest-gpu.log" 2>&1
  stamp "gpu-tests rc=$?"; tail -2 "$OUT/pytest-gpu.log" | tee -a "$OUT/stages.log"; save
fi
cap=$(( $(left) - 5 )); [ $cap -gt 130 ] && cap=130
[ $cap -ge 80 ] && stamp "moe35-off ($cap s)" && NINFER_GDN_FUSED_ROWS=0 \
  NINFER_MOE_ROUTER_KERNEL=0 timeout $cap $H --batches 1,8 > "$OUT/moe35-off.jsonl" \
  2> "$OUT/moe35-off.log"
stamp "moe35-off rc=$?"
grep -h '"decode"' "$OUT/moe35-off.jsonl" | cut -c1-200 | tee -a "$OUT/stages.log"
save; ls -la "$OUT"
