#!/bin/bash
# Run 56 (2026-12-07, thirteenth session): issue 11's 35B-A3B at batch 1 on an H200, the
# Gated DeltaNet decode rows fused (kernels/gated_delta rows_kernel.conv_gated_delta_rows:
# the conv, SiLU, q/k norms and the rule in one kernel) against the unfused rows, A/B by
# NINFER_GDN_FUSED_ROWS in one call; then the better one's 1- and 8-row steps under the
# profiler with each kernel's source lines. First the fused kernel's native tests.
# From the repository root, carry [".whl"]; one call, ~420 s:
#   bash benchmarks/results/run56/device_run56.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o56; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run56.tgz" -C /tmp o56; }
stamp gpu-tests
timeout 150 python3 -m pytest -rA -m gpu tests/kernels/test_gated_delta.py \
  -k "rows" > "$OUT/pytest-gdn-rows.log" 2>&1
stamp "gpu-tests rc=$?"; tail -3 "$OUT/pytest-gdn-rows.log" | tee -a "$OUT/stages.log"
FUSED_OK=0
grep -q "PASSED.*test_fused_conv_rows_kernel_on_the_gpu" "$OUT/pytest-gdn-rows.log" && FUSED_OK=1
H="python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --no-gdn"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.97
for fused in 0 $FUSED_OK; do
  [ -e "$OUT/moe35-fused$fused.jsonl" ] && continue
  stamp "moe35 fused=$fused"
  NINFER_GDN_FUSED_ROWS=$fused timeout 130 $H --batches 1,8,64 > "$OUT/moe35-fused$fused.jsonl" \
    2> "$OUT/moe35-fused$fused.log"
  stamp "moe35 fused=$fused rc=$?"
  grep '"decode"' "$OUT/moe35-fused$fused.jsonl" | cut -c1-230 | tee -a "$OUT/stages.log"
  save
done
best=$(python3 - "$OUT" <<'PY'
import json, sys, pathlib
rate = {}
for fused in (0, 1):
    path = pathlib.Path(sys.argv[1], f"moe35-fused{fused}.jsonl")
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        if row.get("op") == "decode" and row.get("batch") == 1:
            rate[fused] = row["tok_per_s"]
print(max(rate, key=rate.get) if rate else 0)
PY
)
left=$(( ${END:-560} - $(date +%s) + t0 ))
[ $left -gt 150 ] && left=150
stamp "moe35prof fused=$best ($left s)"
[ $left -ge 90 ] && NINFER_GDN_FUSED_ROWS=$best timeout $(( left - 5 )) $H --batches 1,8 \
  --profile /tmp/prof > "$OUT/moe35prof.jsonl" 2> "$OUT/moe35prof.log"
stamp "moe35prof rc=$?"
save; ls -la "$OUT"
