#!/bin/bash
# Run 52b (2026-12-07, eleventh session): after run 52 (35B-A3B batch 1: 239.7 tok/s with
# the activation in a fusion, 202.2 in run 48b), where the rest of the 2-row step goes
# (hybrid_bench --profile: kernels per step, the top ones), then kernel_bench's `moe`
# section (the routed experts alone: both places of the activation, each GEMV over tiles;
# now timed in one fori_loop, run 52's unrolled loop spent its 200 s compiling).
# From the repository root, carry [".whl"]; one call, at most ~300 s:
#   bash benchmarks/results/run52/device_run52b.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o52b; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.97
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp moe35prof
timeout 120 python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --batches 1 \
  --no-gdn --profile /tmp/prof > "$OUT/moe35prof.jsonl" 2> "$OUT/moe35prof.log"
stamp "moe35prof rc=$?"; grep '"decode"' "$OUT/moe35prof.jsonl" | cut -c1-300 | tee -a "$OUT/stages.log"
stamp moe-kernels
timeout 150 python3 benchmarks/kernel_bench.py moe > "$OUT/kernel-moe.log" 2>&1
stamp "moe-kernels rc=$?"
grep '"part": "experts"' "$OUT/kernel_bench.jsonl" | cut -c1-400 | tee -a "$OUT/stages.log"
tar czf "$FINAL/run52b.tgz" -C /tmp o52b && ls -la "$OUT"
