#!/bin/bash
# Run 33: the Mamba-2 kernel natively (issue 19), Qwen3.5-27B prefill with images (issue 17's
# last line), the Nemotron-H-8B shape's decode and prefill (issue 19). From the repository
# root, carry [".whl"]:  bash benchmarks/results/run33/device_run33.sh [STAGES]
. benchmarks/device_common.sh
STAGES=${1:-mamba images nemotron}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
for stage in $STAGES; do
  stamp "$stage"
  case $stage in
    mamba)
      timeout 60 python3 -m pytest -rA -p no:cacheprovider tests/kernels/test_mamba2.py \
        > "$OUT/pytest-mamba2.log" 2>&1
      stamp "mamba pytest rc=$?"
      timeout 80 python3 benchmarks/mamba2_scan_bench.py --tokens 512 2048 8192 \
        > "$OUT/mamba2.jsonl" 2> "$OUT/mamba2.err";;
    images) timeout 320 python3 benchmarks/hybrid_bench.py --presets qwen3.5-27b --batches 1 \
              --images 4 --image-size 448 --no-gdn --json > "$OUT/vision-27b.jsonl" \
              2> "$OUT/vision-27b.log";;
    nemotron) timeout 110 python3 benchmarks/hybrid_bench.py --presets nemotron-h-8b \
                --batches 1,8 --json > "$OUT/nemotron-8b.jsonl" 2> "$OUT/nemotron-8b.log";;
  esac
  stamp "$stage rc=$?"
done
tail -n 3 "$OUT"/pytest-mamba2.log | tee -a "$OUT/stages.log"
