#!/bin/bash
# A/B on this host: $1 = tree, $2 = label
cd $1
PYTHONPATH=$1 JAX_COMPILATION_CACHE_DIR=/work/main/.cache/jax /work/main/.venv/bin/python -m ninfer_jax.cli.main serve artifacts/smollm2-135m-instruct.ninfer --port 18502 --max-context 1024 --max-concurrency 8 > /tmp/ab-$2.log 2>&1 &
for i in $(seq 1 200); do grep -q "more copy shapes ready\|copy shapes compiled" /tmp/ab-$2.log && break; sleep 2; done
sleep 3
for pass in 1 2; do /work/main/.venv/bin/python /work/main/benchmarks/serve_bench.py --url http://127.0.0.1:18502 --concurrency 1 8 --requests-per-client 2 --max-tokens 128 --json > /tmp/ab-$2-pass$pass.jsonl; done
pkill -f "port 18502"; sleep 3
python3 -c "
import json
for p in (1,2):
    for l in open('/tmp/ab-$2-pass%d.jsonl'%p):
        d=json.loads(l); print('$2', p, d.get('concurrency'), round(d.get('decode_tok_s') or 0,1), round(d.get('output_tok_s') or 0,1))
"
