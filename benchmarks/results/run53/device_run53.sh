#!/bin/bash
# Run 53 (prepared 2026-12-07, eleventh session, for an H200; that session got only H100s):
# (1) issue 11's 35B-A3B through JaxRunner at 1 / 8 / 64 rows with the routed experts'
# activation fusion and the shared-expert fold (run 52e on an H100: 251.5 / 911.5 tok/s at
# 1 / 8), then its 1- and 8-row steps under the profiler, each kernel with the source lines
# its HLO came from (trace_summary.hlo_sources); (2) issue 10's 8B step at 1 row under the
# profiler the same way (the ~20 small kernels a layer that keep batch 1 from 240 tok/s).
# From the repository root, carry [".whl"]; one call, at most ~330 s:
#   bash benchmarks/results/run53/device_run53.sh
# Then the live 8B server: bash benchmarks/results/run53/device_run53b.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o53; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
H="python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --no-gdn"
stamp moe35
XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 timeout 110 $H --batches 1,8,64 > "$OUT/moe35.jsonl" \
  2> "$OUT/moe35.log"
stamp "moe35 rc=$?"; grep '"decode"' "$OUT/moe35.jsonl" | cut -c1-260 | tee -a "$OUT/stages.log"
stamp moe35prof
XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 timeout 100 $H --batches 1,8 --profile /tmp/prof \
  > "$OUT/moe35prof.jsonl" 2> "$OUT/moe35prof.log"
stamp "moe35prof rc=$?"
stamp dense-artifact
timeout 70 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b --quiet /tmp/q8.ninfer \
  > "$OUT/artifact.log" 2>&1
stamp "dense-artifact rc=$?"
stamp dense-prof
timeout 60 python3 benchmarks/runner_bench.py /tmp/q8.ninfer --batches 1,64 --context 1024 \
  --prompt 256 --steps 32 --max-context 4096 --modes pipelined --json --profile /tmp/prof8 \
  > "$OUT/dense-prof.jsonl" 2> "$OUT/dense-prof.log"
stamp "dense-prof rc=$?"
tar czf "$FINAL/run53.tgz" -C /tmp o53 && ls -la "$OUT"
