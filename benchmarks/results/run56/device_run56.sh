#!/bin/bash
# Run 56 (2026-12-07, thirteenth session): issue 11's 35B-A3B at batch 1 on an H200 with two
# new kernels, each behind a trace-time switch and A/B'd in one call: the Gated DeltaNet
# decode rows fused with their conv and norms (NINFER_GDN_FUSED_ROWS, kernels/gated_delta
# rows_kernel.conv_gated_delta_rows) and the MoE router's tail as one kernel
# (NINFER_MOE_ROUTER_KERNEL, kernels/moe/routing_kernel.py). First their native tests; a
# kernel whose test fails stays off. Then both off, both on (batches 1 / 8 / 64), the best's
# 1- and 8-row steps under the profiler with each kernel's source lines, then each switch
# alone while time is left.
# From the repository root, carry [".whl"]; one call, ~560 s (END=S: fewer):
#   bash benchmarks/results/run56/device_run56.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o56; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run56.tgz" -C /tmp o56; }
left() { echo $(( ${END:-560} - $(date +%s) + t0 )); }
stamp gpu-tests
timeout 240 python3 -m pytest -rA -m gpu tests/kernels/test_gated_delta.py tests/kernels/test_moe.py \
  tests/kernels/test_moe_router.py > "$OUT/pytest-gpu.log" 2>&1
stamp "gpu-tests rc=$?"; tail -3 "$OUT/pytest-gpu.log" | tee -a "$OUT/stages.log"
G=0; R=0
grep -q "PASSED.*test_fused_conv_rows_kernel_on_the_gpu" "$OUT/pytest-gpu.log" && G=1
grep -q "PASSED.*test_moe_router.py" "$OUT/pytest-gpu.log" \
  && ! grep -q "FAILED.*test_moe_router.py" "$OUT/pytest-gpu.log" && R=1
stamp "switches that may go on: gdn=$G router=$R"
H="python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --no-gdn"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.97
bench() {  # bench GDN ROUTER BATCHES: one configuration's decode figures
  local name="moe35-g$1r$2" cap=$(( $(left) - 5 ))
  [ -e "$OUT/$name.jsonl" ] && return
  [ $cap -gt 130 ] && cap=130
  [ $cap -lt 80 ] && { stamp "no time for $name"; return; }
  stamp "$name ($cap s)"
  NINFER_GDN_FUSED_ROWS=$1 NINFER_MOE_ROUTER_KERNEL=$2 timeout $cap $H --batches $3 \
    > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
  stamp "$name rc=$?"
  grep '"decode"' "$OUT/$name.jsonl" | cut -c1-230 | tee -a "$OUT/stages.log"
  save
}
bench 0 0 1,8,64
bench $G $R 1,8,64
best=$(python3 - "$OUT" <<'PY'
import json, sys, pathlib
rate = {}
for path in pathlib.Path(sys.argv[1]).glob("moe35-g*.jsonl"):
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("op") == "decode" and row.get("batch") == 1:
            rate[path.stem[-4:]] = row["tok_per_s"]
print(max(rate, key=rate.get) if rate else "g0r0")
PY
)
cap=$(( $(left) - 5 )); [ $cap -gt 150 ] && cap=150
stamp "moe35prof $best ($cap s)"
[ $cap -ge 90 ] && NINFER_GDN_FUSED_ROWS=${best:1:1} NINFER_MOE_ROUTER_KERNEL=${best:3:1} \
  timeout $cap $H --batches 1,8 --profile /tmp/prof > "$OUT/moe35prof.jsonl" \
  2> "$OUT/moe35prof.log"
stamp "moe35prof rc=$?"; save
[ $G = 1 ] && [ $R = 1 ] && bench 1 0 1,8 && bench 0 1 1,8
save; ls -la "$OUT"
