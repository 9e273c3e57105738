#!/bin/bash
# Run 15 (2026-12-02): the stable-buffer launch and XLA's command-buffer update modes, the
# fused projections A/B, and the hybrid shapes (issue 11). From the repository root:
#   bash benchmarks/results/run15/device_run15.sh   (carry .whl)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=.:benchmarks:/tmp/site PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jcache
A=/tmp/a/qwen3-8b.ninfer
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
stamp artifact; timeout 120 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b $A --force \
  > /dev/null 2>&1; stamp "artifact rc=$?"
MODE=""
for m in SKIP_PROFILED SKIP_TEMP; do
  if XLA_FLAGS=--xla_gpu_command_buffer_update_mode=$m python3 -c 'import jax.numpy as j; j.ones(2).block_until_ready()' >/dev/null 2>&1; then
    stamp "update mode $m accepted"; [ -z "$MODE" ] && MODE=$m
  else stamp "update mode $m refused"; fi
done
probe() {  # $1 label, $2 XLA_FLAGS, rest: launch_probe args
  label=$1; flags=$2; shift 2
  XLA_FLAGS="$flags" TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3 \
    timeout 120 python3 benchmarks/launch_probe.py $A --batches 1,64 --calls 40 --json "$@" \
    2> /tmp/probe.err | sed "s/^{/{\"label\": \"$label\", /" >> "$OUT/probe.jsonl"
  stamp "probe $label rc=$? updates=$(grep -c 'Updated command buffer in' /tmp/probe.err)"
  grep -o "Updated command buffer in [0-9]* μs" /tmp/probe.err | tail -2
}
probe stable ""
[ -n "$MODE" ] && probe "stable-$MODE" "--xla_gpu_command_buffer_update_mode=$MODE"
cat "$OUT/probe.jsonl"
bench() {  # $1 label, $2 XLA_FLAGS, rest: runner_bench args
  label=$1; flags=$2; shift 2
  XLA_FLAGS="$flags" timeout 110 python3 benchmarks/runner_bench.py $A \
    --context 384 --prompt 256 --steps 32 --json "$@" 2>/tmp/rb.err \
    | sed "s/^{/{\"label\": \"$label\", /" >> "$OUT/runner.jsonl"
  stamp "runner_bench $label rc=$?"; tail -3 /tmp/rb.err
}
BEST=""; [ -n "$MODE" ] && BEST="--xla_gpu_command_buffer_update_mode=$MODE"
bench "fused-stable$MODE" "$BEST" --batches 1,8,64,256
bench "unfused-stable$MODE" "$BEST" --no-fuse --batches 1,64
python3 - "$OUT/runner.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("op") in ("decode", "prefill") and d.get("mode") != "sync":
        print(d["label"], d["op"], d.get("batch"), round(d["tok_per_s"], 1),
              d.get("ms_per_step") and round(d["ms_per_step"], 3), d.get("launch_ms") and round(d["launch_ms"], 2))
PY
rm -rf /tmp/a /tmp/jcache  # disk for the hybrid shapes
export XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 60 python3 -m pytest -rA -p no:cacheprovider tests/kernels/test_moe.py -k "gpu or lower" \
  > "$OUT/pytest-moe.log" 2>&1; stamp "moe tests rc=$? $(tail -1 "$OUT/pytest-moe.log")"
left=$(( 560 - ($(date +%s) - t0) ))
timeout $(( left > 250 ? 250 : left )) python3 benchmarks/hybrid_bench.py --presets qwen3.6-35b-a3b \
  --json > "$OUT/hybrid-35b.jsonl" 2> /tmp/h35.log; stamp "35b rc=$?"
cut -c1-600 "$OUT/hybrid-35b.jsonl"; tail -c 3000 /tmp/h35.log > "$OUT/hybrid-35b.logtail"; tail -5 /tmp/h35.log
stamp done
