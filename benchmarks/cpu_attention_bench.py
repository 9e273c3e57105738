"""Time the CPU decode attention handler (kernels/paged_attention/cpu) over a whole step's
layers, as the runner calls it for the default model (SmolLM2-135M: 9 query heads, 3 kv heads,
head dim 64, 16-token pages): one jitted call attends B rows against each of `--layers`
separate caches, so the pages come cold from memory as they do in a decode step.

    python benchmarks/cpu_attention_bench.py [--contexts 200,1500] [--batches 1,8]
        [--kv-dtypes f32,bf16] [--layers 30] [--repeats 20]

Prints the median and min ms per step (all layers) and the KV bytes read per second.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.kernels.paged_attention import cpu

HEADS, KV_HEADS, HEAD_DIM, PAGE = 9, 3, 64, 16
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}


def step_fn(layers: int):
    def step(q, ks, vs, table, lengths):
        out = jnp.zeros_like(q)
        for k, v in zip(ks, vs):  # unrolled: one handler call per layer, as the model does
            out = out + cpu.paged_decode_attention(q, k, v, table, lengths, scale=0.125)
        return out
    return jax.jit(step)


def time_case(batch: int, context: int, dtype, layers: int, repeats: int):
    rng = np.random.default_rng(0)
    pages_per_row = -(-context // PAGE)
    num_pages = batch * pages_per_row + 1
    table = rng.permutation(np.arange(1, num_pages)).reshape(batch, pages_per_row)
    shape = (num_pages, KV_HEADS, PAGE, HEAD_DIM)
    ks = [jnp.asarray(rng.standard_normal(shape, np.float32), dtype) for _ in range(layers)]
    vs = [jnp.asarray(rng.standard_normal(shape, np.float32), dtype) for _ in range(layers)]
    q = jnp.asarray(rng.standard_normal((batch, HEADS, HEAD_DIM), np.float32))
    lengths = jnp.full((batch,), context, jnp.int32)
    table = jnp.asarray(table, jnp.int32)
    step = step_fn(layers)
    step(q, ks, vs, table, lengths).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(q, ks, vs, table, lengths).block_until_ready()
        times.append(time.perf_counter() - start)
    read = 2 * layers * batch * context * KV_HEADS * HEAD_DIM * jnp.dtype(dtype).itemsize
    return np.median(times) * 1e3, min(times) * 1e3, read / np.median(times) / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="200,1500")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--kv-dtypes", default="f32,bf16")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    for name in args.kv_dtypes.split(","):
        for context in map(int, args.contexts.split(",")):
            for batch in map(int, args.batches.split(",")):
                median, best, rate = time_case(batch, context, DTYPES[name], args.layers,
                                               args.repeats)
                print(f"{name} context {context} batch {batch}: {median:.3f} ms median, "
                      f"{best:.3f} min, {rate:.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
