"""One Gated DeltaNet layer timed alone, for benchmarks/hybrid_bench.py: a prefill chunk and
decode rows.

Prefill: the layer once per prefill path the GPU dispatch can take (kernels/gated_delta:
"reference", "wy", "kernel", forced through NINFER_GDN_PREFILL while tracing; off the GPU
only the reference runs), then the delta rule alone on bf16 values: the reference with its
chunk scan rolled and unrolled, the WY form, and on the GPU the Pallas kernel at a few
(value columns per program, warps) settings, so one run shows which path and tile to serve.

Timing as benchlib.time_op (repetitions inside one jitted call, each depending on the last),
except that the layer's state dict is carried from one repetition to the next: a state passed
in afresh would make every repetition copy the whole slot array before its in-place update,
which the runner (caches donated) never does.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import statistics
import time

import jax
import jax.numpy as jnp

import benchlib
import hybrid_costs
from ninfer_jax.kernels import dispatch, gated_delta
from ninfer_jax.kernels.gated_delta import kernel, reference, wy
from ninfer_jax.model import ragged_batch
from ninfer_jax.model.gated_deltanet import gated_deltanet

KERNEL_TILES = [(32, 4), (64, 4), (128, 4), (32, 8), (64, 8), (128, 8)]  # (block_v, warps)
GDN_LEAVES = ("in_qkv", "in_z", "in_b", "in_a", "conv", "dt_bias", "A_log", "gdn_norm", "out")
FUSED_INPUTS = "in_qkvzba"  # in_qkv | in_z | in_b | in_a on one device (fused_projections)


def gdn_leaves(layer: dict) -> dict:
    """The Gated DeltaNet part of a layer's params (its norms and MLP left out), with the
    runner's fused input projection when it has one."""
    names = GDN_LEAVES if FUSED_INPUTS not in layer else (FUSED_INPUTS,) + GDN_LEAVES[4:]
    return {name: layer[name] for name in names}


def time_carried(fn, x, state, *rest, iters: int, reps: int) -> float:
    """Median seconds per fn(x, state, *rest) -> (out, state), the state carried."""
    def looped(zero, x, state, *rest):
        for _ in range(iters):
            out, state = fn(x, state, *rest)
            bump = jnp.ravel(out)[0].astype(jnp.float32) * zero
            x, state = jax.lax.optimization_barrier((x + bump.astype(x.dtype), state))
        return x, state

    run = jax.jit(looped, donate_argnums=(2,))
    zero = jnp.float32(0.0)
    _, state = jax.block_until_ready(run(zero, x, state, *rest))  # compile + warm up
    samples = []
    for _ in range(reps):
        started = time.perf_counter()
        _, state = jax.block_until_ready(run(zero, x, state, *rest))
        samples.append((time.perf_counter() - started) / iters)
    return statistics.median(samples)


def _state(config, num_slots: int, dtype) -> dict:
    shapes = config.state_shapes()
    return {"conv": jnp.zeros((num_slots, *shapes["conv"]), dtype),
            "recurrent": jnp.zeros((num_slots, *shapes["recurrent"]), jnp.float32)}


@contextlib.contextmanager
def forced_prefill_path(path: str):
    """Trace the Gated DeltaNet prefill through `path` (gated_delta.PREFILL_ENV) meanwhile."""
    before = os.environ.get(gated_delta.PREFILL_ENV)
    os.environ[gated_delta.PREFILL_ENV] = path
    try:
        yield
    finally:
        if before is None:
            del os.environ[gated_delta.PREFILL_ENV]
        else:
            os.environ[gated_delta.PREFILL_ENV] = before


def delta_rule_variants(num_tokens: int, key_dim: int, value_dim: int) -> dict:
    """name -> fn(q, k, v, g, beta, state) of the chunked delta rule's implementations that
    run on this backend (the kernel only on the GPU, where the head dims tile, at each of
    KERNEL_TILES that fits dv)."""
    variants = {
        "reference": functools.partial(reference.chunk_gated_delta, num_tokens=num_tokens),
        "reference_unrolled": functools.partial(reference.chunk_gated_delta,
                                                num_tokens=num_tokens, unroll=True),
        "wy": functools.partial(wy.chunk_gated_delta, num_tokens=num_tokens)}
    if dispatch.use_kernels() and kernel.tiles(gated_delta.CHUNK_SIZE, key_dim, value_dim):
        for block_v, warps in (t for t in KERNEL_TILES if t[0] <= value_dim):
            variants[f"kernel_bv{block_v}_w{warps}"] = functools.partial(
                kernel.chunk_gated_delta, num_tokens=num_tokens, block_v=block_v,
                num_warps=warps)
    return variants


def prefill(config, layer: dict, num_tokens: int, dtype, *, iters: int, reps: int) -> dict:
    """The layer (gdn_leaves) on a num_tokens chunk from a zero state, once per prefill path
    (`layer_ms` by path; `serving_path` is the one the dispatch takes unforced), and its delta
    rule alone (`kernel_ms` by variant, delta_rule_variants)."""
    key = jax.random.PRNGKey(7)
    h = jax.random.normal(key, (num_tokens, config.hidden_size), dtype)
    batch = dataclasses.replace(
        ragged_batch.chunk_only(jnp.zeros(num_tokens, jnp.int32), jnp.int32(0),
                                jnp.int32(num_tokens), jnp.zeros(1, jnp.int32)),
        chunk_state_slot=jnp.int32(1), row_state_slots=jnp.zeros(0, jnp.int32))
    paths = gated_delta.PREFILL_PATHS if dispatch.use_kernels() else ("reference",)
    layer_ms = {}
    for path in paths:
        with forced_prefill_path(path):
            layer_ms[path] = 1e3 * time_carried(
                lambda x, s, w, b: gated_deltanet(x, w, s, b, config), h,
                _state(config, 2, dtype), layer, batch, iters=iters, reps=reps)
    Hk, dk = config.linear_num_key_heads, config.linear_key_head_dim
    Hv, dv = config.linear_num_value_heads, config.linear_value_head_dim
    keys = jax.random.split(key, 5)
    q = jax.random.normal(keys[0], (num_tokens, Hk, dk), jnp.float32) * dk ** -0.5
    k = jax.random.normal(keys[1], (num_tokens, Hk, dk), jnp.float32) * dk ** -0.5
    v = jax.random.normal(keys[2], (num_tokens, Hv, dv), dtype)
    g = -jax.random.uniform(keys[3], (num_tokens, Hv), jnp.float32, 0.01, 0.5)
    beta = jax.random.uniform(keys[4], (num_tokens, Hv), jnp.float32)
    start = jnp.zeros((Hv, dk, dv), jnp.float32)
    kernel_ms = {}
    for name, fn in delta_rule_variants(num_tokens, dk, dv).items():
        kernel_ms[name] = 1e3 * benchlib.time_op(fn, q, k, v, g, beta, start, iters=iters,
                                                 reps=reps)
    kernel_flops = hybrid_costs.gdn_chunk_flops(config, num_tokens)
    layer_flops = 2.0 * num_tokens * hybrid_costs.gdn_projection_params(config) + kernel_flops
    return {"tokens": num_tokens, "layer_ms": layer_ms, "layer_flops": layer_flops,
            "serving_path": gated_delta.prefill_path(), "kernel_ms": kernel_ms,
            "kernel_flops": kernel_flops}


def decode(config, layer: dict, rows: int, dtype, *, iters: int, reps: int) -> dict:
    """The layer (gdn_leaves) on `rows` decode rows, row i on state slot i + 1, with what it
    must move: its weights once, each row's state read and written."""
    h = jax.random.normal(jax.random.PRNGKey(8), (rows, config.hidden_size), dtype)
    batch = dataclasses.replace(
        ragged_batch.rows_only(jnp.zeros(rows, jnp.int32), jnp.full(rows, 100, jnp.int32),
                               jnp.zeros((rows, 1), jnp.int32)),
        chunk_state_slot=jnp.int32(ragged_batch.DUMMY_STATE_SLOT),
        row_state_slots=jnp.arange(1, rows + 1, dtype=jnp.int32))
    seconds = time_carried(lambda x, s, w, b: gated_deltanet(x, w, s, b, config), h,
                           _state(config, rows + 1, dtype), layer, batch, iters=iters,
                           reps=reps)
    shapes = config.state_shapes()
    per_row = (4 * math.prod(shapes["recurrent"])
               + jnp.dtype(dtype).itemsize * math.prod(shapes["conv"]))
    weight_bytes = hybrid_costs.tree_bytes(layer)
    state_bytes = 2 * rows * per_row  # read and written
    return {"rows": rows, "ms": 1e3 * seconds, "weight_bytes": weight_bytes,
            "state_bytes": state_bytes, "bytes": weight_bytes + state_bytes,
            "bandwidth_bytes_per_s": (weight_bytes + state_bytes) / seconds}
