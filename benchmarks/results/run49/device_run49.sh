#!/bin/bash
# Run 49 (2026-12-06, eighth session): issue 14's 4-bit weights on the tensor cores. The
# tensor-core kernel with 4-bit codes as two half tiles (kernel.PACKED_LAYOUT "halves", int4's
# group scale on each group's dot) and one row padded to 16 rows (tuning.ONE_ROW_DOT_FORMATS)
# against the one-row FMA kernel and the interleaved tile; the whole 8B decode step per
# variant (engine_bench) beside bf16 in the same call; kernel_bench's dotsweep for tiles.
# From the repository root, carry [".whl"]; one call (~580 s):
#   bash benchmarks/results/run49/device_run49.sh
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp tests
timeout 100 python3 -m pytest -rA -p no:cacheprovider -m gpu tests/kernels/test_quant_matmul.py \
  > "$OUT/pytest-quant.log" 2>&1
stamp "tests rc=$?"; tail -n 2 "$OUT/pytest-quant.log" | tee -a "$OUT/stages.log"
E="python3 benchmarks/engine_bench.py --model qwen3-8b --decode 1x1024,8x1024,64x1024 --no-ceilings"
engine() {  # name cap args...
  local name=$1 cap=$2; shift 2
  stamp "engine $name"
  timeout "$cap" $E "$@" > "$OUT/engine-$name.log" 2>&1
  stamp "engine $name rc=$?"; grep '"decode"' "$OUT/engine-$name.log" \
    | python3 -c 'import json,sys; [print(r["weights"], r["packed_layout"], r["one_row_dot"], r["batch"], round(r["ms_per_step"], 3), round(r["tok_per_s"], 1)) for r in map(json.loads, sys.stdin)]' \
    | tee -a "$OUT/stages.log"
}
engine int4-halves 80 --weights int4 --packed-layout halves --one-row-dot int4
engine bf16 70 --weights bf16
stamp dotsweep
timeout 200 python3 benchmarks/kernel_bench.py dotsweep > "$OUT/dotsweep.log" 2>&1
stamp "dotsweep rc=$?"
engine int4-fma 70 --weights int4
left=$(( 585 - $(date +%s) + t0 ))
engine nvfp4-halves $(( left > 20 ? left - 5 : 15 )) --weights nvfp4 --packed-layout halves \
  --one-row-dot nvfp4
python3 - "$OUT/kernel_bench.jsonl" <<'PY' | tee -a "$OUT/stages.log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"dotsweep"' in l]
best = {}
for r in rows:
    if "us" not in r: continue
    key = (r["fmt"], r["rows"], r.get("layout", "xla"), "use_dot=True" in r.get("tuning", "x"))
    if key not in best or r["us"] < best[key]["us"]: best[key] = r
for key, r in sorted(best.items(), key=lambda kv: str(kv[0])):
    print(key, round(r["us"], 1), "us", round(r["tbps"], 2), "TB/s", r.get("tuning", ""), r.get("err"))
print(sum("error" in r for r in rows), "configs failed")
PY
