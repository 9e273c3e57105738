#!/bin/bash
# Run 46 (prepared 2026-12-06, sixth session): is the 1.4-2.1 s launch at a load level's turn
# to decode XLA growing its pinned host pool (the host tier's write-through puts)? From the
# repository root, carry [".whl"]; one call, ~90 s on an H100 or H200:
#   bash benchmarks/results/run46/device_run46.sh
# benchmarks/pinned_probe.py twice: XLA's defaults (the pool grows by regions as puts come),
# then with the pool pinned at client start (XLA_PJRT_GPU_HOST_MEMORY_PREALLOCATE, 12 GiB:
# the default --host-context-mib and room).
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o46; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
stamp "probe default"
timeout 60 python3 benchmarks/pinned_probe.py --json > "$OUT/probe-default.jsonl" 2>&1
stamp "probe rc=$?"
stamp "probe preallocated"
XLA_PJRT_GPU_HOST_MEMORY_PREALLOCATE=true XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB=12 \
  timeout 90 python3 benchmarks/pinned_probe.py --json > "$OUT/probe-prealloc.jsonl" 2>&1
stamp "probe rc=$?"
cat "$OUT"/probe-*.jsonl | tee -a "$OUT/stages.log"
tar czf "$FINAL/run46.tgz" -C /tmp o46 && ls -la "$OUT"
