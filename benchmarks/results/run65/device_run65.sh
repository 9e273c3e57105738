#!/bin/bash
# Run 65 (prepared 2026-12-07, fifteenth session): run 61 with run 64's defaults (the vector
# merge, the add + norm kernel, the attention prologue and the fused GDN gates on). One call
# that makes the most of whichever card comes; first a short native check of the prologue
# and norm kernels.
# On an H200: issue 11's 35B-A3B at 1 / 8 rows (its 300 tok/s is an H200 figure; 273.4 on an
# H100 in run 58 before this session's kernels), then issue 10's live 8B server
# (gpu_serve_bench: step, cold and warm start, 1 / 8 / 64 / 256 streams, interference; last
# measured on an H200 in run 49) with four HTTP workers: at 256 streams one worker's event
# loop was the limit there (the engine's own rate 16,146 tok/s, the client's 13,762).
# The H100 branch ran as run 65 (results in a-h100/); the H200 branch has not run, and its
# PDL arm was dropped after that run measured PDL at no gain.
# The H100 branch also ran the 35B-A3B with XLA's programmatic dependent launch on
# (XLA_FLAGS=--xla_gpu_enable_pdl=true, off in jaxlib 0.10-0.11: on Hopper a kernel of the
# command buffer may start while its producer drains, hiding part of each launch gap; the
# 35B-A3B's 2-row step is ~700 kernels).
# On any other card: the 8B step with and without PDL and with the decode splits following
# the rows' lengths (NINFER_DECODE_FOLLOW_LENGTH=1, new), then the 35B-A3B with the GDN gates
# back in their XLA fusion (NINFER_GDN_FUSED_GATES=0: the A/B run 64 left out).
# From the repository root, carry [".whl"]; one call, at most ~560 s (END=S: S seconds):
#   bash benchmarks/results/run65/device_run65.sh
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o65; rm -rf "$OUT"; mkdir -p "$OUT"
. benchmarks/device_common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/stages.log"
save() { tar czf "$FINAL/run65.tgz" -C /tmp o65; }
stamp gpu-tests
timeout 45 python3 -m pytest -rA -m gpu tests/kernels/test_attention_prologue.py tests/kernels/test_add_norm.py \
  > "$OUT/pytest-gpu.log" 2>&1
stamp "gpu-tests rc=$?"; tail -1 "$OUT/pytest-gpu.log" | tee -a "$OUT/stages.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | cut -c1-200 | tee -a "$OUT/stages.log"; save
moe35() {  # moe35 NAME [ENV=VALUE ...]: the 35B-A3B's step at 1 / 8 rows
  local name=$1; shift
  stamp "$name"
  env XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 X=0 "$@" timeout ${CAP:-110} python3 \
    benchmarks/hybrid_bench.py --json --presets qwen3.6-35b-a3b --no-gdn --batches 1,8 \
    > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
  stamp "$name rc=$?"
  show "$OUT/$name.jsonl"; save
}
dense() {  # dense NAME [ENV=VALUE ...]: the 8B step at 1 / 8 rows (run 64's command)
  local name=$1; shift
  stamp "$name"
  env "$@" timeout 100 python3 benchmarks/runner_bench.py /tmp/q8.ninfer --batches 1,8 \
    --context 1024 --prompt 256 --steps 32 --max-context 4096 --modes pipelined --json \
    > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
  stamp "$name rc=$?"
  show "$OUT/$name.jsonl"; save
}
PDL=XLA_FLAGS=--xla_gpu_enable_pdl=true
if grep -q H200 "$OUT/stages.log"; then
  moe35 moe35
  stamp live
  left=$(( ${END:-560} - $(date +%s) + t0 ))
  timeout $left python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b --total $(( left - 5 )) \
    --serve-args "--max-concurrency 256 --max-context 4096 --http-threads 320 --http-workers 4 --response-store-max-records 0" \
    --stages install,artifact,step,cold,warm,load,interference --out "$OUT/gsb" > "$OUT/gsb.out" 2>&1
  stamp "live rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
else
  moe35 moe35
  moe35 moe35-pdl $PDL
  stamp artifact
  timeout 90 python3 -m ninfer_jax.cli.main init-random --preset qwen3-8b /tmp/q8.ninfer \
    --force > "$OUT/artifact.log" 2>&1
  stamp "artifact rc=$?"
  dense dense
  dense dense-pdl $PDL
  dense dense-follow NINFER_DECODE_FOLLOW_LENGTH=1
  left=$(( ${END:-560} - $(date +%s) + t0 ))
  [ $left -gt 100 ] && CAP=$(( left - 5 )) moe35 moe35-gates-xla NINFER_GDN_FUSED_GATES=0
fi
save; ls -la "$OUT"
