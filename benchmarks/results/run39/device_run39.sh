#!/bin/bash
# Run 39 (2026-12-06): run 38's groups (benchmarks/results/run38/device_run38.sh) plus "lanesref":
# the penalty / policy comparisons marked CPU_EXACT (mark lifted), on the GPU under NINFER_FORCE_REFERENCE=1
# (does only the kernels' rounding separate prefill KV from decode KV?). From the repository
# root, carry [".whl"]: bash benchmarks/results/run39/device_run39.sh "gemma lanesref"
# Everything is written to /tmp/o and tarred into $OUT/run39-<groups>.tgz at the end.
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o; rm -rf "$OUT"; mkdir -p "$OUT"
for g in $1; do
  # A group cut by its timeout can leave a spawned child holding the GPU (run 40: a w8a8
  # bench child kept 61.5 GB and the next group's server ran out of memory): clear the card.
  for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
    kill -9 "$p" 2>/dev/null; done
  case $g in
    lanesref)
      . benchmarks/device_common.sh; stamp lanesref
      sed -i 's/^CPU_EXACT = pytest.mark.skipif(jax.default_backend() != "cpu"/CPU_EXACT = pytest.mark.skipif(False/' \
        tests/model/test_penalty_engine.py  # the device's copy only: run the CPU-exact ones too
      NINFER_FORCE_REFERENCE=1 timeout 200 python3 -m pytest -rA -p no:cacheprovider \
        tests/model/test_penalty_engine.py tests/model/test_policy_engine.py \
        > "$OUT/pytest-lanesref.log" 2>&1
      stamp "lanesref rc=$?"; tail -n 3 "$OUT/pytest-lanesref.log" | tee -a "$OUT/stages.log";;
    gemma31)  # run 38's "gemma" without the 32k gather rows
      . benchmarks/device_common.sh; H="python3 benchmarks/hybrid_bench.py --json"
      stamp window-gather; timeout 90 python3 benchmarks/window_attention_bench.py --batches 1,8,64 \
        --contexts 1024,4096 > "$OUT/window-gather.jsonl" 2> "$OUT/window-gather.log"
      stamp "window-gather rc=$?"; stamp gemma-main
      timeout 200 $H --presets gemma4-31b --batches 1,8 > "$OUT/gemma-main.jsonl" 2> "$OUT/gemma-main.log"
      stamp "gemma-main rc=$?";;
    moe35prof)  # the 35B-A3B's decode steps under the profiler (why batch 1 is 5 ms for 6 GB)
      . benchmarks/device_common.sh; stamp moe35prof
      timeout 220 python3 benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --batches 1,8 \
        --no-gdn --profile /tmp/prof > "$OUT/moe35prof.jsonl" 2> "$OUT/moe35prof.log"
      stamp "moe35prof rc=$?";;
    moe35fold)  # the shared expert folded into the routed kernels (A/B against moe35prof)
      . benchmarks/device_common.sh; stamp moe35fold
      NINFER_FOLD_SHARED_EXPERT=1 timeout 150 python3 benchmarks/hybrid_bench.py --json \
        --presets qwen3.6-35b-a3b --batches 1,8 --no-gdn > "$OUT/moe35fold.jsonl" 2> "$OUT/moe35fold.log"
      stamp "moe35fold rc=$?";;
    kvsweep)  # issue 14: the decode kernel's knobs over 8-bit pages at 8 x 32k
      . benchmarks/device_common.sh; stamp kvsweep
      timeout 240 python3 benchmarks/kernel_bench.py kvsweep > "$OUT/kvsweep.jsonl" 2> "$OUT/kvsweep.log"
      stamp "kvsweep rc=$?";;
    gemvsweep)  # issues 10 and 14: can a Pallas one-row loop stream bf16 faster than XLA's dot?
      . benchmarks/device_common.sh; stamp gemvsweep
      timeout 240 python3 benchmarks/kernel_bench.py gemvsweep > "$OUT/gemvsweep.jsonl" 2> "$OUT/gemvsweep.log"
      stamp "gemvsweep rc=$?";;
    w8a8)  # issue 14: W8A8 (quant_matmul/w8a8.py) on the 8B's largest projection, records in
           # the order of the targets (M = 1, 4096, 64, 8, 2, 512); the cap keeps what ran
      . benchmarks/device_common.sh; stamp w8a8
      timeout 200 python3 benchmarks/kernel_bench.py w8a8-gate_up > "$OUT/w8a8.jsonl" 2> "$OUT/w8a8.log"
      stamp "w8a8 rc=$?"
      timeout 100 python3 -m pytest -rA -p no:cacheprovider tests/kernels/test_quant_matmul_w8a8.py \
        > "$OUT/pytest-w8a8.log" 2>&1
      stamp "w8a8 tests rc=$?"; tail -n 2 "$OUT/pytest-w8a8.log" | tee -a "$OUT/stages.log";;
    hybrid27)  # issue 11: the 27B at batch 1 / 8 / 64 (64 never measured; needs the H200)
      . benchmarks/device_common.sh; stamp hybrid27
      timeout 280 python3 benchmarks/hybrid_bench.py --json --presets qwen3.5-27b --batches 1,8,64 \
        --no-gdn > "$OUT/hybrid27.jsonl" 2> "$OUT/hybrid27.log"
      stamp "hybrid27 rc=$?";;
    *) bash benchmarks/results/run38/device_run38.sh "$g";;
  esac
done
[ -n "$NO_TAR" ] || { tar czf "$FINAL/run39-${1// /-}.tgz" -C "$OUT" . && ls -la "$OUT"; }
