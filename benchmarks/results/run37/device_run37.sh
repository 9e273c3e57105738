#!/bin/bash
# Run 37 (2026-12-05): after run 36 put the GDN prefill kernel on (GPU_PREFILL "kernel") and the
# executable store's key learned the trace-time overrides (run 36's override A/B loaded the
# unforced executables). From the repository root, carry [".whl"]:
#   bash benchmarks/results/run37/device_run37.sh      (one call, ~8 min)
# The decode rows' kernel A/B (NINFER_GDN_ROWS_KERNEL=1 against the reference) on 4 layers of
# the 27B shape and on the 35B-A3B shape, the 35B-A3B at batch 1/8/64 on the new prefill path,
# then Nemotron 3 Nano's MoE shape while time is left.
. benchmarks/device_common.sh
H="python3 benchmarks/hybrid_bench.py --json"
run() { local name=$1 cap=$2; shift 2; stamp "$name"
  timeout "$cap" "$@" > "$OUT/$name.jsonl" 2> "$OUT/$name.log"; stamp "$name rc=$?"; }
run gdn27-rows-ref 100 $H --presets qwen3.5-27b --layers 4 --batches 1,8 --no-gdn
NINFER_GDN_ROWS_KERNEL=1 run gdn27-rows-kernel 100 $H --presets qwen3.5-27b --layers 4 \
  --batches 1,8 --no-gdn
run moe35 150 $H --presets qwen3.6-35b-a3b --batches 1,8,64 --no-gdn
NINFER_GDN_ROWS_KERNEL=1 run moe35-rows-kernel 130 $H --presets qwen3.6-35b-a3b --batches 1,8 \
  --no-gdn
left=$(( 450 - ($(date +%s) - t0) ))
[ $left -gt 60 ] && run nemotron-nano $left $H --presets nemotron-3-nano-30b-a3b --batches 1,8
for f in "$OUT"/*.log; do case $f in */stages.log) ;; *) tail -c 3000 "$f" > "$f.tail"; rm -f "$f";; esac; done
