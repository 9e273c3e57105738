#!/bin/bash
# Run 17 (2026-12-02): decode steps of 1..128 rows on the 8B shape, the cost of speculative
# verify rows (a verify round of K drafts for B sequences is a decode step of B * (K + 1)
# rows). From the repository root: bash benchmarks/results/run17/device_run17.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=.:benchmarks:/tmp/site PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
timeout 70 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b /tmp/a/q.ninfer --force >/dev/null 2>&1
stamp "artifact rc=$?"
timeout 150 python3 benchmarks/runner_bench.py /tmp/a/q.ninfer --batches 1,2,4,8,16,32,64,128 \
  --context 384 --prompt 256 --steps 16 --json > "$OUT/runner.jsonl" 2> /tmp/rb.err
stamp "runner_bench rc=$?"; tail -2 /tmp/rb.err
python3 - "$OUT/runner.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("op") == "decode" and d["mode"] == "pipelined":
        print(d["batch"], round(d["ms_per_step"], 3), round(d["tok_per_s"], 1))
PY
