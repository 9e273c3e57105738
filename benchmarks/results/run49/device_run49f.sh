#!/bin/bash
# Run 49f: the shortest form of device_run49e.sh for the last ~100 s of a session's device
# time: the PTX nibble decode's native tests, then int4 through the 8B step with it (the jnp
# decode's step is in run 49's a-quant/: 5.81 / 6.36 / 12.92 ms).
#   bash benchmarks/results/run49/device_run49f.sh
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$OUT/stages.log"
stamp tests
timeout 40 python3 -m pytest -rA -p no:cacheprovider -m gpu tests/kernels/test_quant_matmul.py \
  -k "nibble_ptx or halves_layout_on_gpu" > "$OUT/pytest-ptx.log" 2>&1
stamp "tests rc=$?"; tail -n 2 "$OUT/pytest-ptx.log" | tee -a "$OUT/stages.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-ptx.log" | head | tee -a "$OUT/stages.log"
stamp engine
timeout 60 python3 benchmarks/engine_bench.py --model qwen3-8b --decode 1x1024,8x1024,64x1024 \
  --no-ceilings --weights int4 --nibble-decode ptx > "$OUT/engine-int4-ptx.log" 2>&1
stamp "engine rc=$?"; grep '"decode"' "$OUT/engine-int4-ptx.log" | cut -c1-330 | tee -a "$OUT/stages.log"
