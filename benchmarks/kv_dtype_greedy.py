"""Greedy text of the default model (SmolLM2-135M) with each `--kv-dtype` against f32 pages,
through the engine's scheduler and step loop (tests/engine/test_context_cache_exact.generate):
how many tokens each prompt keeps before its first difference (docs/numerics.md).

    PYTHONPATH=. python benchmarks/kv_dtype_greedy.py [auto,fp8,int8,k8v4,nvfp4]
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "engine"))
import test_context_cache_exact as t  # noqa: E402
from ninfer_jax.artifact.default_model import ensure_default_artifact  # noqa: E402
from ninfer_jax.artifact.format import load_artifact  # noqa: E402
from ninfer_jax.engine.runner import JaxRunner, kv_dtype_for  # noqa: E402

# the test's engine config, sized for these prompts
t.CONTEXT, t.CHUNK, t.PAGE = 256, 32, 16
artifact = load_artifact(ensure_default_artifact(), weights=True)
tok = artifact.load_tokenizer()
texts = ["The capital of France is", "Write a short poem about the sea.\n",
         "def fibonacci(n):\n    ", "Once upon a time, in a small village,"]
prompts = [tok.encode(x) for x in texts]
prompts = [list(p.ids) if hasattr(p, "ids") else list(p) for p in prompts]
outs = {}
names = (sys.argv[1] if len(sys.argv) > 1 else "auto,fp8,int8,k8v4,nvfp4").split(",")
for name in ["auto"] + [n for n in names if n != "auto"]:
    t0 = time.time()
    r = JaxRunner(artifact, num_pages=40, page_size=16, max_batch=2, max_context=256,
                  prefill_chunk=32, kv_dtype=kv_dtype_for(name), step_shapes="essential")
    o, _ = t.generate(r, prompts, num_pages=40, host_pages=0, concurrent=True, max_tokens=40,
                      prefix_reuse=False)
    outs[name] = o
    same = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
            for x, y in zip(o, outs["auto"])]
    print(name, r.kv_dtype.name, r.page_bytes, "tokens equal to f32 before the first "
          "difference:", same, f"{time.time()-t0:.0f}s", flush=True)
    for x in o[:2]:
        print("   ", repr(tok.decode(x))[:150], flush=True)
