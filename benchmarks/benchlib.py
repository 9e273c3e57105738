"""Timing helpers shared by the GPU benchmarks (jax + numpy only, so they run on the device
machine without the serving dependencies).

`time_op` runs an op `iters` times inside ONE jitted call, each repetition depending on the
previous one: the first argument is bumped by (a value from EVERY output) x (a zero that arrives
as a runtime argument, so XLA cannot fold it away). Host dispatch is paid once per timed call
and XLA can neither hoist, merge nor drop a repetition. The repetitions are unrolled: an XLA
while loop pays a host round trip per iteration (tens of microseconds here). The figure is the
median over `reps` calls divided by `iters`.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp


def time_op(fn, first, *rest, iters: int = 20, reps: int = 5) -> float:
    """Median seconds per call of fn(first, *rest) -> array(s)."""
    def looped(zero, first, *rest):
        carry = first
        for _ in range(iters):
            out = fn(carry, *rest)
            bump = sum(jnp.ravel(leaf)[0].astype(jnp.float32) for leaf in jax.tree.leaves(out))
            # The barrier keeps XLA from fusing consecutive repetitions into one pass.
            carry = jax.lax.optimization_barrier(carry + (bump * zero).astype(carry.dtype))
        return carry

    run = jax.jit(looped)
    zero = jnp.float32(0.0)
    jax.block_until_ready(run(zero, first, *rest))  # compile + warm up
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(run(zero, first, *rest))
        samples.append((time.perf_counter() - start) / iters)
    return statistics.median(samples)


def gemv_bandwidth(rows: int = 1, copies: int = 8, *, k: int = 4096, n: int = 14336) -> float:
    """XLA bf16 GEMV bandwidth (bytes/s): x [rows, k] times `copies` distinct k x n weights in
    turn (by default 4096x14336, together far larger than L2), the decode-shaped ceiling."""
    keys = jax.random.split(jax.random.PRNGKey(3), copies)
    weights = [jax.random.normal(key, (k, n), jnp.bfloat16) for key in keys]
    x = jax.random.normal(jax.random.PRNGKey(4), (rows, k), jnp.bfloat16)
    seconds = time_op(lambda x, ws: [x @ w for w in ws], x, weights, iters=10)
    return copies * k * n * 2 / seconds


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
