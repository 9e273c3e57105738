#!/bin/bash
# Run 41's groups (prepared 2026-12-06, third session). From the repository root, carry
# [".whl"]: bash benchmarks/results/run41/device_run41.sh "widen w8a8e2e live"
# Groups not defined here fall through to run 39's script (gemma31 moe35prof moe35fold hybrid27
# kvsweep gemvsweep w8a8 lanesref, and run 38's). Everything goes to /tmp/o41 (run 39's groups write /tmp/o, copied in); tarred into
# $OUT/run41-<groups>.tgz at the end unless NO_TAR is set.
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o41; rm -rf "$OUT"; mkdir -p "$OUT"
for g in $1; do
  # A group cut by its timeout can leave a spawned child holding the GPU (run 40): clear the card.
  for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
    kill -9 "$p" 2>/dev/null; done
  case $g in
    widen)  # issue 14: fp8 widened to float16 (FP8_WIDEN): the GPU tests, then the decode knobs
      . benchmarks/device_common.sh; stamp widen-tests
      timeout 150 python3 -m pytest -rA -p no:cacheprovider -m gpu tests/kernels/test_fp8_pages.py \
        tests/kernels/test_quant_matmul.py tests/kernels/test_block_attention.py \
        > "$OUT/pytest-widen.log" 2>&1
      stamp "widen tests rc=$?"; tail -n 2 "$OUT/pytest-widen.log" | tee -a "$OUT/stages.log"
      # run 40's last calls took kv4 (fp8 as float16: 1.34x bf16 pages); now its knobs
      stamp kvsweep; timeout 240 python3 benchmarks/kernel_bench.py kvsweep > "$OUT/kvsweep.jsonl" \
        2> "$OUT/kvsweep.log"
      stamp "kvsweep rc=$?";;
    w8a8e2e)  # issue 14: the whole 8B step with W8A8 projections against bf16, same call
      . benchmarks/device_common.sh; E="python3 benchmarks/engine_bench.py --model qwen3-8b"
      D="--decode 1x1024,8x1024,64x1024 --prefill 4096"
      stamp e2e-bf16; timeout 120 $E --weights bf16 $D > "$OUT/e2e-bf16.log" 2>&1; stamp "bf16 rc=$?"
      for w in int8 fp8; do
        stamp "e2e-$w-w8a8"; NINFER_W8A8=1 timeout 120 $E --weights $w $D --no-ceilings \
          > "$OUT/e2e-$w-w8a8.log" 2>&1; stamp "$w w8a8 rc=$?"
      done;;
    live)  # issue 10: the live server at 1 / 8 / 64 / 256 against the same run's step
      . benchmarks/device_common.sh; stamp live
      timeout 540 python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b --total 530 \
        --out "$OUT/gsb" > "$OUT/gsb.out" 2>&1
      stamp "live rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log";;
    *) NO_TAR=1 bash benchmarks/results/run39/device_run39.sh "$g"; mkdir -p "$OUT/$g"; cp -r /tmp/o/. "$OUT/$g"/ 2>/dev/null;;
  esac
done
[ -n "$NO_TAR" ] || { tar czf "$FINAL/run41-${1// /-}.tgz" -C "$OUT" . && ls -la "$OUT"; }
