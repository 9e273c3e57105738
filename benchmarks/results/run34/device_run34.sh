#!/bin/bash
# Run 34 (issue 12; replaces run 32's artifact-based script: a 27B bf16 artifact does not fit
# the device's disk comfortably, hybrid_bench makes the weights on the device): the verify
# step's cost at K = 1, 3, 7, 15 against a plain step at batch 1 and 8 on the Qwen3.5-27B shape
# (verify rows chain their Gated DeltaNet state), then K = 3 with the MTP head drafting 3 in
# every step, and MTP's acceptance on random weights (meaningless: it proves the head runs).
# From the repository root, carry [".whl"]:  bash benchmarks/results/run34/device_run34.sh
. benchmarks/device_common.sh
STAGES=${1:-verify mtp}
B="benchmarks/hybrid_bench.py --presets qwen3.5-27b --prompt 1024 --steps 16 --no-gdn --json"
for stage in $STAGES; do
  stamp "$stage"
  case $stage in
    verify) timeout 330 python3 $B --batches 1,8 --verify 1,3,7,15 > "$OUT/verify-27b.jsonl" \
              2> "$OUT/verify-27b.log";;
    mtp) timeout 230 python3 $B --batches 1 --verify 3 --mtp 3 --mtp-acceptance 64 \
           > "$OUT/mtp-27b.jsonl" 2> "$OUT/mtp-27b.log";;
  esac
  stamp "$stage rc=$?"
done
for f in "$OUT"/verify-27b.log "$OUT"/mtp-27b.log; do tail -c 3000 "$f" > "$f.tail"; rm -f "$f"; done
