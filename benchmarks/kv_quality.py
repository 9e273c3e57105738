"""What narrower KV pages cost in quality: for each --kv-dtype, the relative error of a
prompt's logits against f32 pages, and how many greedy tokens stay equal to f32 pages.

    PYTHONPATH=. .venv/bin/python benchmarks/kv_quality.py [ARTIFACT] [--tokens 32]
        [--dtypes bf16,fp8,int8]

On the CPU the compute stays f32 (the runner's default there), so the difference is only
the pages. Prints one JSON object per (prompt, dtype).
"""
from __future__ import annotations

import argparse
import json

import jax.numpy as jnp
import numpy as np

from ninfer_jax.artifact import load_artifact
from ninfer_jax.artifact.default_model import ensure_default_artifact
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner import JaxRunner, kv_dtype_for
from ninfer_jax.engine.runner_api import DecodeRow, PrefillUnit, SampleSpec
from ninfer_jax.model import steps

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
           "Once upon a time, in a small village,"]
PAGE_SIZE = 16
GREEDY = SampleSpec(SamplingParams(temperature=0.0), 0)


def prompt_logits(runner, ids):
    """f32 logits after `ids`, from the family's own prefill over a copy of the caches."""
    family = steps.FAMILIES[runner.config.architecture]
    width = -(-max(len(ids), 1) // PAGE_SIZE)
    tokens = np.zeros(width * PAGE_SIZE, np.int32)
    tokens[:len(ids)] = ids
    table = jnp.arange(1, 1 + width, dtype=jnp.int32)
    logits, _ = family.prefill(runner.params, runner.kv, jnp.asarray(tokens), jnp.int32(0),
                               jnp.int32(len(ids)), table, config=runner.config,
                               page_size=PAGE_SIZE)
    return np.asarray(logits)


def greedy(runner, ids, num_tokens):
    """Greedy tokens after `ids` through the runner (one prefill chunk, then decode rows)."""
    width = -(-(len(ids) + num_tokens) // PAGE_SIZE)
    table = np.arange(1, 1 + width, dtype=np.int32)
    prompt_table = table[:-(-len(ids) // PAGE_SIZE)]
    out = [int(runner.prefill(PrefillUnit(0, np.asarray(ids, np.int32), 0, prompt_table,
                                          GREEDY)))]
    while len(out) < num_tokens:
        position = len(ids) + len(out) - 1
        row = DecodeRow(0, out[-1], position, table[:position // PAGE_SIZE + 1],
                        SampleSpec(GREEDY.params, len(out)))
        out.append(int(runner.decode([row])[0]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", nargs="?")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--dtypes", default="bf16,fp8,int8")
    args = parser.parse_args()
    artifact = load_artifact(args.artifact or ensure_default_artifact())
    common = dict(num_pages=64, page_size=PAGE_SIZE, max_batch=1, max_context=512,
                  prefill_chunk=64)
    reference = JaxRunner(artifact, **common, kv_dtype=kv_dtype_for("f32"))
    tokenizer = artifact.load_tokenizer()
    encode = lambda text: list(tokenizer.encode(text))  # noqa: E731
    wanted = {text: (prompt_logits(reference, encode(text)),
                     greedy(reference, encode(text), args.tokens)) for text in PROMPTS}
    for name in args.dtypes.split(","):
        runner = JaxRunner(artifact, **common, kv_dtype=kv_dtype_for(name))
        for text, (logits, tokens) in wanted.items():
            ids = encode(text)
            got, ours = prompt_logits(runner, ids), greedy(runner, ids, args.tokens)
            top2 = np.sort(logits)[-2:]
            equal = next((i for i, (a, b) in enumerate(zip(ours, tokens)) if a != b),
                         len(tokens))
            print(json.dumps({"kv_dtype": name, "prompt": text,
                              "logit_rel_error": float(np.linalg.norm(got - logits)
                                                       / np.linalg.norm(logits)),
                              "f32_top2_margin": float(top2[1] - top2[0]),
                              "greedy_equal_tokens": equal, "tokens": len(tokens)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
