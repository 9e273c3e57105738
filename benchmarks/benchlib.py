"""Timing helpers shared by the GPU benchmarks (jax + numpy only, so they run on the device
machine without the serving dependencies).

`time_op` runs an op `iters` times inside ONE jitted fori_loop, each iteration depending on the
previous one through a zero-valued bump of the first argument, so host dispatch is paid once per
timed call and XLA cannot hoist the op out of the loop. The figure is the median over `reps`
calls divided by `iters`.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax


def time_op(fn, first, *rest, iters: int = 20, reps: int = 5) -> float:
    """Median seconds per call of fn(first, *rest) -> array(s)."""
    def looped(first, *rest):
        def body(_, carry):
            out = fn(carry, *rest)
            leaf = jax.tree.leaves(out)[0]
            bump = (jnp.ravel(leaf)[0] * 0).astype(carry.dtype)
            return carry + bump
        return lax.fori_loop(0, iters, body, first)

    run = jax.jit(looped)
    jax.block_until_ready(run(first, *rest))  # compile + warm up
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(run(first, *rest))
        samples.append((time.perf_counter() - start) / iters)
    return statistics.median(samples)


def copy_bandwidth(num_bytes: int = 2 << 30) -> float:
    """Device memory bandwidth (bytes/s) of an elementwise read+write of a bf16 array."""
    x = jnp.ones((num_bytes // 2,), jnp.bfloat16)
    seconds = time_op(lambda a: a * 1.0001, x, iters=10)
    return 2 * num_bytes / seconds


def matmul_rate(n: int = 8192) -> float:
    """bf16 matmul FLOP/s through XLA for an n^3 product."""
    key = jax.random.PRNGKey(0)
    a = jax.random.normal(key, (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.bfloat16)
    seconds = time_op(lambda x, y: x @ y, a, b, iters=10)
    return 2 * n ** 3 / seconds


class Recorder:
    """Collects result rows, prints them as they come and writes JSON lines under $OUT."""

    def __init__(self, name: str):
        out_dir = os.environ.get("OUT", ".")
        self.path = os.path.join(out_dir, f"{name}.jsonl")
        self.rows: list[dict] = []

    def add(self, **row):
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def environment() -> dict:
    dev = jax.devices()[0]
    return {"jax": jax.__version__, "device": getattr(dev, "device_kind", str(dev)),
            "backend": jax.default_backend()}
