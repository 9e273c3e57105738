#!/bin/bash
# Run 62 (prepared 2026-12-07, fourteenth session; any card, after run 61): the kernel sweeps
# that decide the next defaults. kernels/skinny_matmul against XLA's bf16 dot on the 8B's
# four projections at 1 / 2 / 8 rows (issue 10's batch 1: the 8B's step needs its 15 GB of
# projections faster than run 20's 3.4-4.2 TB/s), then kernel_bench's `moe` sweep (the expert
# GEMV's tiles with its tensor-core form) if run 61 did not reach it.
# From the repository root, carry [".whl"]; one call, ~450 s (END=S: S seconds):
#   bash benchmarks/results/run62/device_run62.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o62; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run62.tgz" -C /tmp o62; }
left() { echo $(( ${END:-450} - $(date +%s) + t0 )); }
stamp gpu-tests
timeout 90 python3 -m pytest -rA -m gpu tests/kernels/test_skinny_matmul.py \
  > "$OUT/pytest-gpu.log" 2>&1
stamp "gpu-tests rc=$?"; tail -1 "$OUT/pytest-gpu.log" | tee -a "$OUT/stages.log"; save
stamp "skinny ($(left) s)"
timeout -s ABRT 220 python3 benchmarks/kernel_bench.py skinny > "$OUT/kernel-skinny.log" 2>&1
stamp "skinny rc=$?"; save
cap=$(( $(left) - 10 ))
stamp "moe ($cap s)"
[ $cap -gt 60 ] && timeout -s ABRT $cap python3 benchmarks/kernel_bench.py moe \
  > "$OUT/kernel-moe.log" 2>&1
stamp "moe rc=$?"; save; ls -la "$OUT"
