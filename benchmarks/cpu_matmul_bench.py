"""What one decode step's matrix products cost on this host, by row count and weight format.

    .venv/bin/python benchmarks/cpu_matmul_bench.py [--rows 1 2 8] [--matrices 90]
        [--formats f32 numpy int8-weights int8-both]

A jitted chain of products over `--matrices` distinct random weights shaped like the default
model's projections (576 x 1536, far more bytes in all than the caches hold), for M rows:
- f32: `acc @ w` in f32 (what the CPU path runs);
- numpy: the same chain through numpy's BLAS;
- int8-weights: int8 weights converted to f32 inside the jit, then the f32 dot;
- int8-both: activations quantized to int8 per row too, an int8 x int8 -> int32 dot.
It shows how much a decode batch of M rows costs against one row, and what narrower weights
would buy, before any model, attention or scheduler is involved.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

K, N = 576, 1536
SCALE = 1e-3  # keeps values finite along the chain


def chain_f32(x, weights):
    acc = x
    for w in weights:
        acc = acc + (acc @ w)[:, :K] * SCALE
    return acc


def chain_int8_weights(x, weights):
    acc = x
    for w in weights:
        acc = acc + (acc @ w.astype(jnp.float32))[:, :K] * SCALE
    return acc


def chain_int8_both(x, weights):
    acc = x
    for w in weights:
        step = jnp.max(jnp.abs(acc), axis=-1, keepdims=True) / 127 + 1e-12
        q = jnp.round(acc / step).astype(jnp.int8)
        y = jax.lax.dot(q, w, preferred_element_type=jnp.int32).astype(jnp.float32)
        acc = acc + (y * step)[:, :K] * SCALE
    return acc


def timed(fn, repeats: int = 10) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 8])
    parser.add_argument("--matrices", type=int, default=90)
    parser.add_argument("--formats", nargs="+", default=["f32", "numpy", "int8-weights",
                                                         "int8-both"])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((K, N), np.float32) for _ in range(args.matrices)]
    codes = [jnp.asarray(rng.integers(-127, 128, (K, N), np.int8)) for _ in range(args.matrices)]
    device = [jnp.asarray(w) for w in host]
    runs = {"f32": (jax.jit(chain_f32), device), "int8-weights": (jax.jit(chain_int8_weights),
            codes), "int8-both": (jax.jit(chain_int8_both), codes)}
    print(f"{args.matrices} matrices {K}x{N} ({args.matrices * K * N * 4 / 1e9:.2f} GB in f32)")
    for rows in args.rows:
        x = rng.standard_normal((rows, K), np.float32)
        cells = []
        for fmt in args.formats:
            if fmt == "numpy":
                seconds = timed(lambda: chain_f32(x, host))
            else:
                fn, weights = runs[fmt]
                seconds = timed(lambda: fn(jnp.asarray(x), weights).block_until_ready())
            cells.append(f"{fmt} {seconds * 1e3:7.2f} ms")
        print(f"rows {rows}:  " + "   ".join(cells))


if __name__ == "__main__":
    main()
