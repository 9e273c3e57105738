#!/bin/bash
# Run 52c (2026-12-07, eleventh session): run 52b's two stages again. Its profile came from
# a one-row runner (`--batches 1` alone: hybrid_bench's runner then has one row bucket), so
# here `--batches 1,8` (a lone row padded to 2, as served); its kernel bench printed nothing
# in 150 s, so now with progress lines and a Python traceback when the cap hits.
# From the repository root, carry [".whl"]; one call, at most ~300 s:
#   bash benchmarks/results/run52/device_run52c.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o52c; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp moe35prof
timeout 130 python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --batches 1,8 \
  --no-gdn --profile /tmp/prof > "$OUT/moe35prof.jsonl" 2> "$OUT/moe35prof.log"
stamp "moe35prof rc=$?"; grep '"decode"' "$OUT/moe35prof.jsonl" | cut -c1-300 | tee -a "$OUT/stages.log"
stamp moe-kernels
timeout -s ABRT 140 python3 benchmarks/kernel_bench.py moe > "$OUT/kernel-moe.log" 2>&1
stamp "moe-kernels rc=$?"; tail -n 30 "$OUT/kernel-moe.log" | cut -c1-300 | tee -a "$OUT/stages.log"
tar czf "$FINAL/run52c.tgz" -C /tmp o52c && ls -la "$OUT"
