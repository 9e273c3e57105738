"""What one decode step's matrix products cost on this host, by row count.

    .venv/bin/python benchmarks/cpu_matmul_bench.py [--rows 1 2 8] [--matrices 90]

A jitted chain of `acc @ w` over `--matrices` distinct random f32 weights shaped like the
default model's projections (576 x 1536, far more bytes in all than the caches hold), for M
rows, next to numpy's BLAS doing the same. It shows how much a decode batch of M rows costs
against one row before any model, attention or scheduler is involved.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

K, N = 576, 1536


def chain(x, weights):
    acc = x
    for w in weights:
        acc = acc + (acc @ w)[:, :K] * 1e-3  # keeps values finite along the chain
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
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((K, N), np.float32) for _ in range(args.matrices)]
    device = [jnp.asarray(w) for w in host]
    jitted = jax.jit(chain)
    gb = args.matrices * K * N * 4 / 1e9
    print(f"{args.matrices} f32 matrices {K}x{N} ({gb:.2f} GB)")
    for rows in args.rows:
        x = rng.standard_normal((rows, K), np.float32)
        xla = timed(lambda: jitted(jnp.asarray(x), device).block_until_ready())
        blas = timed(lambda: chain(x, host))
        print(f"rows {rows}: XLA {xla * 1e3:6.2f} ms ({gb / xla:5.1f} GB/s)   "
              f"numpy {blas * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
