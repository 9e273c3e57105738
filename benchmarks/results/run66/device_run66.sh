#!/bin/bash
# Run 66 (prepared 2026-12-08, sixteenth session; any card, after run 65): where the 8B's
# 64- and 256-row steps go with the current defaults. Run 21's profile (before the prologue,
# the add + norm kernel and the vector merge) had paged decode attention at 1.49 ms of a 6.99
# ms step at 64 rows (2.5 TB/s of KV) and 5.17 of 12.66 ms at 256 (2.8 TB/s): issue 10's
# concurrency 64 (>= 10,000 tok/s, the step gave 9,398 in run 49) needs it faster. First
# kernel_bench's `splits` sweep (the context split at the server's 4k table, where the split
# follows the table: 4 splits of 1,024 tokens at 64 rows, 1 at 256), then the step at 1 / 64 /
# 256 rows under the profiler at the server's max context.
# From the repository root, carry [".whl"]; one call, ~540 s (END=S: S seconds):
#   bash benchmarks/results/run66/device_run66.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o66; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run66.tgz" -C /tmp o66; }
left() { echo $(( ${END:-540} - $(date +%s) + t0 )); }
stamp "splits"
timeout -s ABRT 250 python3 benchmarks/kernel_bench.py splits > "$OUT/kernel-splits.log" 2>&1
stamp "splits rc=$?"
python3 - "$OUT/kernel_bench.jsonl" <<'PY' | tee -a "$OUT/stages.log"
import json, sys
best = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "us" not in r:
        continue
    key = (r["batch"], r["context"])
    if r["tag"] == "splits-default":
        print("default", key, round(r["us"], 1), round(r["tbps"], 2))
    elif key not in best or r["us"] < best[key]["us"]:
        best[key] = r
for key, r in best.items():
    print("best", key, round(r["us"], 1), round(r["tbps"], 2), r["tuning"])
PY
save
[ -f /tmp/q8.ninfer/metadata.json ] || { stamp artifact; timeout 90 python3 -m ninfer_jax.cli.main \
  init-random --preset qwen3-8b /tmp/q8.ninfer --force > "$OUT/artifact.log" 2>&1; \
  stamp "artifact rc=$?"; }
cap=$(( $(left) - 10 ))
stamp "profile ($cap s)"
[ $cap -gt 60 ] && timeout $cap python3 benchmarks/runner_bench.py /tmp/q8.ninfer \
  --batches 1,64,256 --context 384 --prompt 256 --steps 16 --json --modes pipelined \
  --max-context 4096 --profile /tmp/prof66 > "$OUT/profile.jsonl" 2> "$OUT/profile.log"
stamp "profile rc=$?"
grep -o '"op": "profile".\{0,120\}' "$OUT/profile.jsonl" | tee -a "$OUT/stages.log"
save; ls -la "$OUT"
