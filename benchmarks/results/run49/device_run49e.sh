#!/bin/bash
# Run 49e (2026-12-06, eighth session): the half-tile kernel's 4-bit codes decoded by inline
# PTX on 32-bit words (kernel.NIBBLE_DECODE "ptx") against the jnp decode, after the new
# defaults (half tiles, one row on the tensor cores for int4 / nvfp4 / fp8, W8A8 on the GPU).
# From the repository root, carry [".whl"]; one call (~240 s):
#   bash benchmarks/results/run49/device_run49e.sh
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp tests
timeout 70 python3 -m pytest -rA -p no:cacheprovider -m gpu tests/kernels/test_quant_matmul.py \
  tests/kernels/test_quant_matmul_w8a8.py > "$OUT/pytest-quant.log" 2>&1
stamp "tests rc=$?"; tail -n 2 "$OUT/pytest-quant.log" | tee -a "$OUT/stages.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-quant.log" | head -20 | tee -a "$OUT/stages.log"
E="python3 benchmarks/engine_bench.py --model qwen3-8b --decode 1x1024,8x1024,64x1024 --no-ceilings"
engine() {  # name cap args...
  local name=$1 cap=$2; shift 2
  stamp "engine $name"
  timeout "$cap" $E "$@" > "$OUT/engine-$name.log" 2>&1
  stamp "engine $name rc=$?"; grep '"decode"' "$OUT/engine-$name.log" \
    | python3 -c 'import json,sys; [print(r["weights"], r["nibble_decode"], r["batch"], round(r["ms_per_step"], 3), round(r["tok_per_s"], 1)) for r in map(json.loads, sys.stdin)]' \
    | tee -a "$OUT/stages.log"
}
engine int4-ptx 60 --weights int4 --nibble-decode ptx
stamp dotsweep
timeout 100 python3 -c "import kernel_bench as kb; kb.dot_sweep_section(fmts=('int4', 'nvfp4'), configs=[(256, 128, 8, 3), (256, 128, 4, 3)])" \
  > "$OUT/dotsweep.log" 2>&1
stamp "dotsweep rc=$?"
python3 - "$OUT/kernel_bench.jsonl" <<'PY' | tee -a "$OUT/stages.log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
best = {}
for r in rows:
    if "us" not in r: continue
    key = (r["fmt"], r["rows"], r.get("layout", "xla"), "use_dot=True" in r.get("tuning", "x"))
    if key not in best or r["us"] < best[key]["us"]: best[key] = r
for key, r in sorted(best.items(), key=lambda kv: str(kv[0])):
    print(key, round(r["us"], 1), "us", round(r["tbps"], 2), "TB/s", r.get("tuning", ""), r.get("err"))
print(sum("error" in r for r in rows), "configs failed", [r["error"][:200] for r in rows if "error" in r][:2])
PY
engine int4-jnp 55 --weights int4
