#!/bin/bash
# Run 66 (prepared 2026-12-08, sixteenth session; any card, after run 65): the 8B's 64- and
# 256-row steps. Run 21's profile had paged decode attention at 1.49 ms of a 6.99 ms step at
# 64 rows (2.5 TB/s of KV) and 5.17 of 12.66 ms at 256 (2.8 TB/s): issue 10's concurrency 64
# (>= 10,000 tok/s; the step gave 9,398 in run 49) needs it faster. The split count follows
# the page table (the server's 4k), not the rows: 4 splits of 1,024 tokens at 64 rows, of
# which a 384-token row fills one. New: splits that follow each row's length
# (NINFER_DECODE_FOLLOW_LENGTH=1, kernels/paged_attention/kernel.py FOLLOW_LENGTH).
# Stages: the decode kernel's native tests (both splits); kernel_bench's `splits` sweep; the
# 8B step at 1 / 64 / 256 rows at the server's max context with the table's splits and with
# the length's; the default step under the profiler in the time left.
# From the repository root, carry [".whl"]; one call, ~560 s (END=S: S seconds):
#   bash benchmarks/results/run66/device_run66.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o66; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run66.tgz" -C /tmp o66; }
left() { echo $(( ${END:-560} - $(date +%s) + t0 )); }
stamp gpu-tests
timeout 60 python3 -m pytest -rA -m gpu tests/kernels/test_paged_attention.py \
  -k "decode_kernel_on_gpu" > "$OUT/pytest-gpu.log" 2>&1
stamp "gpu-tests rc=$?"; tail -1 "$OUT/pytest-gpu.log" | tee -a "$OUT/stages.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | cut -c1-200 | tee -a "$OUT/stages.log"; save
stamp "splits"
timeout -s ABRT 200 python3 benchmarks/kernel_bench.py splits > "$OUT/kernel-splits.log" 2>&1
stamp "splits rc=$?"
python3 - "$OUT/kernel_bench.jsonl" <<'PY' | tee -a "$OUT/stages.log"
import json, sys
best = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "us" not in r:
        continue
    key = (r["batch"], r["context"], "follow_length=True" in r["tuning"])
    if r["tag"] == "splits-default":
        print("default", key[:2], round(r["us"], 1), round(r["tbps"], 2))
    elif key not in best or r["us"] < best[key]["us"]:
        best[key] = r
for key, r in sorted(best.items()):
    print("best", key, round(r["us"], 1), round(r["tbps"], 2), r["tuning"])
PY
save
artifact_8b
step() {  # step NAME [ENV=VALUE ...] -- [runner_bench args]: the 8B step, 384-token contexts
  local name=$1; shift
  stamp "$name"
  env "$@" timeout 100 python3 benchmarks/runner_bench.py /tmp/q8.ninfer --batches 1,64,256 \
    --context 384 --prompt 256 --steps 32 --json --modes pipelined --max-context 4096 \
    > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
  stamp "$name rc=$?"
  show "$OUT/$name.jsonl"; save
}
step step
step step-follow NINFER_DECODE_FOLLOW_LENGTH=1
cap=$(( $(left) - 10 ))
stamp "profile ($cap s)"
[ $cap -gt 60 ] && timeout $cap python3 benchmarks/runner_bench.py /tmp/q8.ninfer \
  --batches 1,64,256 --context 384 --prompt 256 --steps 16 --json --modes pipelined \
  --max-context 4096 --profile /tmp/prof66 > "$OUT/profile.jsonl" 2> "$OUT/profile.log"
stamp "profile rc=$?"
grep -o '"op": "profile".\{0,120\}' "$OUT/profile.jsonl" | tee -a "$OUT/stages.log"
save; ls -la "$OUT"
