#!/bin/bash
# Run 55 (2026-12-07, twelfth session): run 53 (prepared by the eleventh session, which got only H100s) plus issue 14:
# (1) issue 11's 35B-A3B through JaxRunner at 1 / 8 / 64 rows with the routed experts'
# activation fusion and the shared-expert fold (run 52e on an H100: 251.5 / 911.5 tok/s at
# 1 / 8), then its 1- and 8-row steps under the profiler, each kernel with the source lines
# its HLO came from (trace_summary.hlo_sources); (2) issue 10's 8B step at 1 row under the
# profiler the same way (the ~20 small kernels a layer that keep batch 1 from 240 tok/s).
# (3) issue 14: the same 8B artifact's projections quantized to int8 at load (runner_bench
# --weights int8, W8A8 at every row count) at 1 and 64 rows, under the profiler with sources,
# against (2)'s bf16 figures of the same call.
# From the repository root, carry [".whl"]; one call, at most ~520 s (END=S: fewer;
# ONLY_MOE=1: the 35B-A3B stages alone, ~230 s):
#   bash benchmarks/results/run55/device_run55.sh
# Then the live 8B server: bash benchmarks/results/run53/device_run53b.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o55; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
H="python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --no-gdn"
stamp moe35
XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 timeout 110 $H --batches 1,8,64 > "$OUT/moe35.jsonl" \
  2> "$OUT/moe35.log"
stamp "moe35 rc=$?"; grep '"decode"' "$OUT/moe35.jsonl" | cut -c1-260 | tee -a "$OUT/stages.log"
tar czf "$FINAL/run55.tgz" -C /tmp o55  # the figures come back even if a later stage runs out
stamp moe35prof
XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 timeout 100 $H --batches 1,8 --profile /tmp/prof \
  > "$OUT/moe35prof.jsonl" 2> "$OUT/moe35prof.log"
stamp "moe35prof rc=$?"
# ONLY_MOE=1: stop here (a lease with ~230 s left)
[ -n "$ONLY_MOE" ] && { tar czf "$FINAL/run55.tgz" -C /tmp o55; exit 0; }
stamp dense-artifact
timeout 70 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b --quiet /tmp/q8.ninfer \
  > "$OUT/artifact.log" 2>&1
stamp "dense-artifact rc=$?"
stamp dense-prof
timeout 60 python3 benchmarks/runner_bench.py /tmp/q8.ninfer --batches 1,64 --context 1024 \
  --prompt 256 --steps 32 --max-context 4096 --modes pipelined --json --profile /tmp/prof8 \
  > "$OUT/dense-prof.jsonl" 2> "$OUT/dense-prof.log"
stamp "dense-prof rc=$?"
left=$(( ${END:-520} - $(date +%s) + t0 ))
[ $left -gt 170 ] && left=170
[ $left -lt 90 ] && stamp "no time for int8 ($left s)"
[ $left -ge 90 ] && stamp int8-prof && timeout $(( left - 5 )) python3 benchmarks/runner_bench.py /tmp/q8.ninfer --weights int8 --batches 1,64 \
  --context 1024 --prompt 256 --steps 32 --max-context 4096 --modes pipelined --json \
  --profile /tmp/prof8i > "$OUT/int8-prof.jsonl" 2> "$OUT/int8-prof.log"
stamp "int8-prof rc=$?"
grep -h '"decode"' "$OUT/dense-prof.jsonl" "$OUT/int8-prof.jsonl" | cut -c1-400 | tee -a "$OUT/stages.log"
tar czf "$FINAL/run55.tgz" -C /tmp o55 && ls -la "$OUT"
