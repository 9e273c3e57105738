#!/bin/bash
# Run 32 (not run yet; written on the mtp branch as "run 29", renumbered at the merge with
# main, which has its own runs 29-31): speculation on the hybrid Qwen3.5-27B shape (issue 12).
# The verify step's cost at K = 1, 3, 7, 15 drafts against a plain decode step at batch 1
# and 8 (verify rows chain their Gated DeltaNet state: model/gated_deltanet.py), then the
# same with the MTP head drafting K = 3 in every step, and MTP's acceptance on random weights (meaningless: it proves the
# head runs). From the repository root, carry [".whl"]:
#   bash benchmarks/results/run32/device_run32.sh [PRESET] [STAGES]
# PRESET defaults to qwen3.5-27b (qwen3.5-tiny checks the script in a minute); STAGES is any
# of "artifact verify mtp" (default all three; each fits one 10-minute device call on the 27B
# shape, the artifact stays in /tmp/a while the machine is warm).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PRESET=${1:-qwen3.5-27b}; STAGES=${2:-artifact verify mtp}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
[ -d /tmp/site/falcon ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:benchmarks:/tmp/site JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
ART=/tmp/a/$PRESET.ninfer
BENCH="benchmarks/runner_bench.py $ART --batches 1,8 --context 384 --prompt 256 --steps 8 --modes sync --json"
for stage in $STAGES; do
  stamp "$stage"
  case $stage in
    artifact) timeout 540 python3 -m ninfer_jax.cli.main init-random --preset "$PRESET" "$ART" \
                --force --quiet;;
    verify) timeout 560 python3 $BENCH --verify 1,3,7,15 > "$OUT/verify.jsonl" 2> "$OUT/verify.err";;
    mtp) timeout 560 python3 $BENCH --verify 3 --mtp 3 --mtp-acceptance 64 \
           > "$OUT/mtp.jsonl" 2> "$OUT/mtp.err";;
  esac
  stamp "$stage rc=$?"
done
python3 - "$OUT"/verify.jsonl "$OUT"/mtp.jsonl <<'PY' 2>/dev/null | tee -a "$OUT/stages.log"
import json, sys
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for d in map(json.loads, lines):
        tag = f"{path.rsplit('/', 1)[-1]} mtp={d['mtp_drafts']}"
        if d["op"] == "decode":
            print(tag, "decode batch", d["batch"], round(d["ms_per_step"], 3), "ms")
        elif d["op"] == "verify":
            print(tag, "verify batch", d["batch"], "K", d["draft_tokens"],
                  round(d["ms_per_step"], 3), "ms", round(d["relative"], 2), "x")
        elif d["op"] == "mtp_acceptance":
            print(tag, "acceptance", d["accepted"], "/", d["drafted"], "in", d["rounds"],
                  "rounds,", d["tokens"], "tokens,", round(d["seconds"], 1), "s")
PY
