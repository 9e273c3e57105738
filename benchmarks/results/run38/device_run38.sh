#!/bin/bash
# Run 38 (written 2026-12-05, for the next session's device time). Each group fits one
# 10-minute call; from the repository root, carry [".whl"]. Start with "gemma" (it may close
# issue 19: if the windowed gather brings the 31B near its GEMV ceiling, no window kernel is
# needed), then in this order of value:
#   bash benchmarks/results/run38/device_run38.sh "hybrid"   (~7 min) issue 11's missing
#       figures with both GDN kernels on: the full 27B at batch 1/8/64 (64 never measured),
#       the 35B-A3B at 1/8/64 with a per-kernel profile of its decode steps (why batch 1 is
#       4.6 ms for 6 GB: 38% of the GEMV ceiling, target 300 tok/s), then the same with the
#       shared expert folded into the routed kernels (A/B; flip FOLD_SHARED_EXPERT if it wins)
#   bash benchmarks/results/run38/device_run38.sh "live"     (~9 min) issue 10's live levels
#       (C = 1 / 8 / 64 against the same run's bare step, every shape compiled first)
#   bash benchmarks/results/run38/device_run38.sh "kv"       (~7 min) issue 14: the 4-bit KV pages
#       (k8v4, nvfp4) natively in the Pallas decode kernel, then decode attention at 32k x 8 and
#       4k x 1 per KV dtype against bf16 (kernel_bench kv4; every row's `path` must be pallas)
#   bash benchmarks/results/run38/device_run38.sh "dflash"   (~8 min) issue 12's drafting cost
#       on the 27B (hybrid) and 8B (dense) shapes (the drafter's block attention now on the
#       decode kernel: kernels/paged_attention/block.py), and DFlash on dense targets natively
#   bash benchmarks/results/run38/device_run38.sh "gemma"    (~5 min) issue 19 on main: Gemma 4 31B
#       with its sliding layers on the windowed gather (ragged_attention/windowed.py, no loop;
#       run 29's 21.2 / 137.5 tok/s walked the whole table in the reference), and the gather
#       against the reference's block walk for one sliding layer (window_attention_bench)
#   bash benchmarks/results/run38/device_run38.sh "swa"      (~8 min) issue 19: the sliding-window
#       kernel (benchmarks/pending/swa-window-kernel.patch, applied to the device's copy only):
#       its native tests, the window kernel bench, Gemma 4 31B against run 29's 21.2 / 137.5 tok/s
# Tar $OUT's folders at the end of a call (at most 8 files come back).
. benchmarks/device_common.sh
STAGES=${1:-hybrid}
H="python3 benchmarks/hybrid_bench.py --json"
run() { local name=$1 cap=$2; shift 2; stamp "$name"
  timeout "$cap" "$@" > "$OUT/$name.jsonl" 2> "$OUT/$name.log"; stamp "$name rc=$?"; }
for stage in $STAGES; do
  case $stage in
    hybrid)
      run hybrid-27b 280 $H --presets qwen3.5-27b --batches 1,8,64 --no-gdn
      run hybrid-35b 200 $H --presets qwen3.6-35b-a3b --batches 1,8,64 --no-gdn \
        --profile /tmp/prof
      # the shared expert folded into the routed kernels (fused_projections.FOLD_SHARED_EXPERT)
      NINFER_FOLD_SHARED_EXPERT=1 run hybrid-35b-fold 130 $H --presets qwen3.6-35b-a3b \
        --batches 1,8 --no-gdn;;
    live)
      stamp live
      timeout 560 python3 benchmarks/gpu_serve_bench.py --out "$OUT/gsb" --total 550 \
        --stages install,artifact,step,warm,load --levels 1,8,64 \
        --runner-args "--batches 1,8,64 --context 384 --prompt 256 --steps 32 --json" \
        --caps "install=60,artifact=100,step=120,warm=90,compiled=150,level=80" \
        > "$OUT/gsb.out" 2>&1
      stamp "live rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log";;
    dflash)
      for v in dflash dflash2; do
        run dflash-27b-$v 120 python3 benchmarks/dflash_bench.py --preset qwen3.5-27b \
          --variant $v --rows 1,8 --drafts 7,15 --context 4096
        run dflash-8b-$v 90 python3 benchmarks/dflash_bench.py --preset qwen3-8b \
          --variant $v --rows 1,8 --drafts 7,15 --context 4096; done
      stamp dflash-tests
      timeout 150 python3 -m pytest -rA -p no:cacheprovider tests/model/test_dflash.py \
        tests/kernels/test_block_attention.py > "$OUT/pytest-dflash.log" 2>&1
      stamp "dflash-tests rc=$?"; tail -n 3 "$OUT/pytest-dflash.log" | tee -a "$OUT/stages.log";;
    kv)
      stamp kv-tests
      timeout 240 python3 -m pytest -rA -p no:cacheprovider -m gpu tests/kernels/test_four_bit_pages.py \
        tests/kernels/test_fp8_pages.py tests/kernels/test_paged_attention.py \
        tests/kernels/test_ragged_attention.py > "$OUT/pytest-kv.log" 2>&1
      stamp "kv-tests rc=$?"; tail -n 3 "$OUT/pytest-kv.log" | tee -a "$OUT/stages.log"
      run kv4-bench 200 python3 benchmarks/kernel_bench.py kv4;;
    gemma)
      run window-gather 90 python3 benchmarks/window_attention_bench.py --batches 1,8,64 \
        --contexts 1024,4096
      run window-gather-32k 60 python3 benchmarks/window_attention_bench.py --batches 1,8 \
        --contexts 32768
      run gemma-main 200 $H --presets gemma4-31b --batches 1,8;;
    swa)
      git apply benchmarks/pending/swa-window-kernel.patch || { stamp "swa: patch failed"; continue; }
      stamp swa-tests
      timeout 200 python3 -m pytest -rA -p no:cacheprovider tests/kernels/test_window_attention.py \
        tests/kernels/test_paged_attention.py tests/kernels/test_ragged_attention.py \
        tests/kernels/test_fp8_pages.py > "$OUT/pytest-swa.log" 2>&1
      stamp "swa-tests rc=$?"; tail -n 3 "$OUT/pytest-swa.log" | tee -a "$OUT/stages.log"
      run swa-kernel 90 python3 benchmarks/kernel_bench.py window
      run swa-gemma 200 $H --presets gemma4-31b --batches 1,8;;
  esac
done
for f in "$OUT"/*.log; do case $f in */stages.log|*/pytest-*) ;; *) tail -c 3000 "$f" > "$f.tail"; rm -f "$f";; esac; done
