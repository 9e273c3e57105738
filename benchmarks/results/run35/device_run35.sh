#!/bin/bash
# Run 35 (issues 11, 12): the chunked Gated DeltaNet prefill natively (WY form and Pallas
# kernel, tests/kernels/test_gated_delta_chunked.py -m gpu), run 34's 27B verify steps again
# with the chained rows in WY form, and the GDN prefill paths A/B on 4 layers of the 27B shape.
# From the repository root, carry [".whl"]:  bash benchmarks/results/run35/device_run35.sh
. benchmarks/device_common.sh
STAGES=${1:-gdntest verify gdnbench}
B="benchmarks/hybrid_bench.py --presets qwen3.5-27b --prompt 1024 --steps 16 --no-gdn --json"
for stage in $STAGES; do
  stamp "$stage"
  case $stage in
    gdntest) timeout 120 python3 -m pytest -rA -p no:cacheprovider -m gpu \
               tests/kernels/test_gated_delta_chunked.py > "$OUT/pytest-gdn.log" 2>&1;;
    verify) timeout 200 python3 $B --batches 1,8 --verify 1,3,7,15 > "$OUT/verify-27b.jsonl" \
              2> "$OUT/verify-27b.log";;
    gdnbench) timeout 170 python3 benchmarks/hybrid_bench.py --presets qwen3.5-27b --layers 4 \
                --batches 1 --json > "$OUT/gdn-27b.jsonl" 2> "$OUT/gdn-27b.log";;
  esac
  stamp "$stage rc=$?"
done
tail -n 8 "$OUT/pytest-gdn.log" | tee -a "$OUT/stages.log"
for f in "$OUT"/*.log; do [ "$f" = "$OUT/pytest-gdn.log" ] || [ "$f" = "$OUT/stages.log" ] || \
  { tail -c 3000 "$f" > "$f.tail"; rm -f "$f"; }; done
