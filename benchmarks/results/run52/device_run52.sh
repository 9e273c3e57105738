#!/bin/bash
# Run 52 (2026-12-07, eleventh session): issue 11's 35B-A3B batch-1 decode (>= 300 tok/s).
# Run 48c's profile had the routed experts' down GEMV at 61 us a layer (16 MB of weights)
# when it re-read the gate/up GEMV's 16 K splits in every program; the activation now sits
# in one XLA fusion between the GEMVs (kernels/moe/kernel.py ACTIVATION_AT). (1) the MoE
# kernels natively; (2) kernel_bench's `moe` section: the routed experts alone, both places
# of the activation, each GEMV over tiles; (3) the 35B-A3B through JaxRunner at 1 / 8 rows
# (run 48b's command: 202.2 / 869.5 tok/s on an H100), then a lone row unpadded (48c: 134.8).
# From the repository root, carry [".whl"]; one call, at most ~560 s:
#   bash benchmarks/results/run52/device_run52.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o52; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.97
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp moe-tests
timeout 90 python3 -m pytest -rA -p no:cacheprovider tests/kernels/test_moe.py -k "gpu or lower" \
  > "$OUT/pytest-moe.log" 2>&1
stamp "moe-tests rc=$?"; tail -n 1 "$OUT/pytest-moe.log" | tee -a "$OUT/stages.log"
stamp moe-kernels
timeout 200 python3 benchmarks/kernel_bench.py moe > "$OUT/kernel-moe.log" 2>&1
stamp "moe-kernels rc=$?"
grep '"part": "experts"' "$OUT/kernel_bench.jsonl" | cut -c1-400 | tee -a "$OUT/stages.log"
stamp moe35
timeout 200 python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --batches 1,8 \
  --no-gdn > "$OUT/moe35.jsonl" 2> "$OUT/moe35.log"
stamp "moe35 rc=$?"; grep '"decode"' "$OUT/moe35.jsonl" | cut -c1-400 | tee -a "$OUT/stages.log"
left=$(( 540 - $(date +%s) + t0 ))
if [ $left -gt 70 ]; then
  stamp moe35-one-row
  timeout $left python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --batches 1 \
    --min-rows 1 --no-gdn > "$OUT/moe35-one-row.jsonl" 2> "$OUT/moe35-one-row.log"
  stamp "moe35-one-row rc=$?"; grep '"decode"' "$OUT/moe35-one-row.jsonl" | cut -c1-400 \
    | tee -a "$OUT/stages.log"
fi
tar czf "$FINAL/run52.tgz" -C /tmp o52 && ls -la "$OUT"
