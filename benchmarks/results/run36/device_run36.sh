#!/bin/bash
# Run 36 (not run: written 2026-12-04 when no device was lent for the rest of the session).
# What the second session of 2026-12-04 built without a GPU, in the order to validate it.
# Each STAGE group fits one 10-minute device call; from the repository root, carry [".whl"]:
#   bash benchmarks/results/run36/device_run36.sh "gdntest moetest gdnbench"     (~7 min)
#   bash benchmarks/results/run36/device_run36.sh "verify moe35"                 (~8 min)
#   bash benchmarks/results/run36/device_run36.sh "dflash nemotronmoe"           (~9 min)
#   bash benchmarks/results/startup-pipeline/device_run.sh                        (~9 min)
# After the tests pass and the A/B says so, flip the switches in kernels/gated_delta
# (GPU_PREFILL = "wy" or "kernel", GPU_ROWS_KERNEL = True). The sliding-window kernel is
# benchmarks/pending/swa-window-kernel.patch (git apply; its own commands in docs/benchmarks.md).
. benchmarks/device_common.sh
STAGES=${1:-gdntest moetest gdnbench}
H="python3 benchmarks/hybrid_bench.py --json"
for stage in $STAGES; do
  stamp "$stage"
  case $stage in
    gdntest) timeout 150 python3 -m pytest -rA -p no:cacheprovider \
               tests/kernels/test_gated_delta_chunked.py tests/kernels/test_gated_delta.py \
               > "$OUT/pytest-gdn.log" 2>&1;;
    moetest) timeout 120 python3 -m pytest -rA -p no:cacheprovider tests/kernels/test_moe.py \
               -k "gpu or lower" > "$OUT/pytest-moe.log" 2>&1;;
    gdnbench) # the GDN layer per prefill path and per decode-rows path, 4 layers of 27B
      timeout 150 $H --presets qwen3.5-27b --layers 4 --batches 1,8 > "$OUT/gdn-27b.jsonl" \
        2> "$OUT/gdn-27b.log"
      NINFER_GDN_PREFILL=wy NINFER_GDN_ROWS_KERNEL=1 timeout 120 $H --presets qwen3.5-27b \
        --layers 4 --batches 1,8 --no-gdn > "$OUT/gdn-27b-new.jsonl" 2> "$OUT/gdn-27b-new.log";;
    verify) timeout 200 $H --presets qwen3.5-27b --prompt 1024 --steps 16 --no-gdn \
              --batches 1,8 --verify 1,3,7,15 > "$OUT/verify-27b.jsonl" 2> "$OUT/verify-27b.log";;
    moe35) timeout 240 $H --presets qwen3.6-35b-a3b --batches 1,8 --no-gdn \
             > "$OUT/moe-35b.jsonl" 2> "$OUT/moe-35b.log";;
    dflash) for v in dflash dflash2; do
              timeout 150 python3 benchmarks/dflash_bench.py --preset qwen3.5-27b --variant $v \
                --rows 1,8 --drafts 7,15 --context 4096 >> "$OUT/dflash-27b.jsonl" \
                2>> "$OUT/dflash-27b.log"; done;;
    nemotronmoe) timeout 240 $H --presets nemotron-3-nano-30b-a3b --batches 1,8 \
                   > "$OUT/nemotron-nano.jsonl" 2> "$OUT/nemotron-nano.log";;
  esac
  stamp "$stage rc=$?"
done
for f in "$OUT"/pytest-*.log; do [ -f "$f" ] && tail -n 6 "$f" | tee -a "$OUT/stages.log"; done
for f in "$OUT"/*.log; do case $f in */pytest-*|*/stages.log) ;; *) [ -f "$f" ] && \
  { tail -c 3000 "$f" > "$f.tail"; rm -f "$f"; };; esac; done
