#!/usr/bin/env bash
# Issue 18's acceptance run: llama.cpp's llama-server and `ninfer serve` on this machine, the
# default model's GGUF on both (ours converted with the default --weights), the same streaming
# chat prompts and token counts (benchmarks/serve_bench.py: temperature 0, ignore_eos, 128
# tokens, concurrency 1 and 8, 2 requests per client), one server at a time, ROUNDS rounds
# alternating. One JSON line per level, tagged with the server, appended to OUT.
#
#   benchmarks/cpu_serve_compare.sh LLAMA_SERVER OUT.jsonl [ROUNDS] [ARTIFACT]
#
# LLAMA_SERVER: a llama-server binary built from the llama.cpp that llama-cpp-python 0.3.36
# vendors (docs/benchmarks.md says how); it runs with 2 threads and 8 parallel slots of 1,024
# tokens, as ninfer serve runs with 8 lanes of 1,024.
set -euo pipefail
LLAMA_SERVER=$1 OUT=$2 ROUNDS=${3:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv/bin/python
ARTIFACT=${4:-$ROOT/artifacts/smollm2-135m-instruct.ninfer}
GGUF=$("$PY" -m ninfer_jax.artifact.default_model --gguf-path)
PORT=18450

wait_up() {
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$PORT/health" | grep -q '"ok"' && return 0
    sleep 1
  done
  echo "server did not come up" >&2; return 1
}

bench() {  # $1: server name
  "$PY" "$ROOT/benchmarks/serve_bench.py" --url "http://127.0.0.1:$PORT" --concurrency 1 8 \
      --requests-per-client 2 --max-tokens 128 --json \
    | "$PY" -c "import json, sys
for line in sys.stdin:
    if line.startswith('{'):
        print(json.dumps({'server': '$1', **json.loads(line)}))" >> "$OUT"
}

for round in $(seq "$ROUNDS"); do
  "$LLAMA_SERVER" -m "$GGUF" -t 2 --parallel 8 -c 8192 --host 127.0.0.1 --port $PORT \
      > /tmp/cpu_serve_compare.llama.log 2>&1 &
  pid=$!
  wait_up && bench llama-server
  kill $pid; wait $pid 2>/dev/null || true
  "$ROOT/.venv/bin/ninfer" serve "$ARTIFACT" --host 127.0.0.1 --port $PORT --max-context 1024 \
      --max-concurrency 8 > /tmp/cpu_serve_compare.ninfer.log 2>&1 &
  pid=$!
  wait_up && bench ninfer
  kill $pid; wait $pid 2>/dev/null || true
done
