#!/bin/bash
# Run 42 (2026-12-06, fourth session), at commit 58bf10a: the decode kernel's SPLIT_BY ("length",
# then the default, against "table"; measured no better and removed after, so `splitby` needs
# that commit). From the repository root, carry [".whl"]:
#   bash benchmarks/results/run42/device_run42.sh "splitby live"
# splitby: the attention kernels' GPU tests, then kernel_bench splitby (both rules on the
# server's shapes). live: the step bench at the server's 4k max context and the live server
# at 1 / 8 / 64 / 256 (no cold start: run 41 measured it). Everything goes to /tmp/o42,
# tarred into $OUT/run42-<groups>.tgz at the end.
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o42; rm -rf "$OUT"; mkdir -p "$OUT"
for g in $1; do
  for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
    kill -9 "$p" 2>/dev/null; done
  case $g in
    splitby)
      . benchmarks/device_common.sh; stamp splitby-tests
      timeout 150 python3 -m pytest -rA -p no:cacheprovider -m gpu tests/kernels/test_paged_attention.py \
        tests/kernels/test_ragged_attention.py tests/kernels/test_block_attention.py \
        tests/kernels/test_fp8_pages.py tests/kernels/test_four_bit_pages.py \
        tests/kernels/test_window_attention.py > "$OUT/pytest-splitby.log" 2>&1
      stamp "splitby tests rc=$?"; tail -n 2 "$OUT/pytest-splitby.log" | tee -a "$OUT/stages.log"
      stamp splitby-bench; timeout 120 python3 benchmarks/kernel_bench.py splitby \
        > "$OUT/splitby.jsonl" 2> "$OUT/splitby.log"
      stamp "splitby bench rc=$?";;
    live)
      . benchmarks/device_common.sh; stamp live
      timeout 360 python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b --total 350 \
        --stages install,artifact,step,warm,load --out "$OUT/gsb" > "$OUT/gsb.out" 2>&1
      stamp "live rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
      grep -h "slow step submit" "$OUT"/gsb/server-*.log | head -20 | tee -a "$OUT/stages.log";;
  esac
done
[ -n "$NO_TAR" ] || { tar czf "$FINAL/run42-${1// /-}.tgz" -C "$OUT" . && ls -la "$OUT"; }
