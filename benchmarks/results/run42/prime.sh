#!/bin/bash
# Run 42's last call: benchmarks/prime_probe.py on the 8B shape (runs 1-4 of each compiled
# step, one at a time). From the repository root, carry [".whl"].
OUT=${OUT:-/tmp/out}; . benchmarks/device_common.sh
stamp artifact; timeout 75 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b --quiet \
  --force /tmp/q8.ninfer > "$OUT/artifact.log" 2>&1; stamp "artifact rc=$?"
stamp probe; timeout 130 python3 benchmarks/prime_probe.py /tmp/q8.ninfer --shapes 0x64,256x32,0x8 \
  --runs 4 --json > "$OUT/prime.jsonl" 2> "$OUT/prime.log"; stamp "probe rc=$?"
cat "$OUT/prime.jsonl"; tail -3 "$OUT/prime.log"
