"""The attention prologue as a Pallas kernel (GPU), same contract as reference.py.

One program per (token, head) over the q heads, then the K/V heads: it loads the head's two
halves from the fused projection's row (in place: no split copies), normalises them in
registers when the model has QK-norm, rotates them, and stores q's head, or k's head and v's
head into their cache pages at the token's slot (the caches are aliased to the outputs, so
the pool is updated in place as XLA's scatter updates it). Lowering: Pallas' Triton backend,
tested in interpret mode on CPU.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

# A head's 128 values at 2 bytes: one warp holds both halves.
NUM_WARPS = 1


def attention_prologue(qkv, q_norm, k_norm, cos, sin, slots, k_cache, v_cache, *,
                       num_heads: int, num_kv_heads: int, eps: float,
                       interpret: bool = False):
    """See reference.attention_prologue; None where the kernel does not apply: caches that
    are not plain arrays of one dtype (8- and 4-bit pages), a half head width that is not a
    power of two (Triton's tile sides), one of the two norms without the other, or shapes
    that disagree."""
    heads = num_heads + 2 * num_kv_heads
    if qkv.ndim != 2 or qkv.shape[1] % heads or isinstance(k_cache, tuple) \
            or isinstance(v_cache, tuple):  # 8- and 4-bit pages carry scales
        return None
    N, D = qkv.shape[0], qkv.shape[1] // heads
    half = D // 2
    if (D % 2 or half & (half - 1) or k_cache.ndim != 4 or v_cache.shape != k_cache.shape
            or k_cache.shape[1] != num_kv_heads or k_cache.shape[3] != D
            or k_cache.dtype != v_cache.dtype
            or (q_norm is None) != (k_norm is None) or cos.shape != (N, half)
            or sin.shape != (N, half) or slots.shape != (N,)):
        return None
    norms = [] if q_norm is None else [jnp.stack([q_norm, k_norm]).astype(jnp.float32)]
    whole = lambda a: pl.BlockSpec(a.shape, lambda *_: (0,) * a.ndim)  # noqa: E731
    args = [slots.astype(jnp.int32), qkv, cos.astype(jnp.float32), sin.astype(jnp.float32),
            *norms, k_cache, v_cache]
    q = jax.ShapeDtypeStruct((N, num_heads, D), qkv.dtype)
    cache = jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype)
    kernel = functools.partial(_prologue_kernel, num_heads=num_heads,
                               num_kv_heads=num_kv_heads, eps=eps, normed=bool(norms))
    return tuple(pl.pallas_call(
        kernel,
        grid=(N, num_heads + num_kv_heads),
        in_specs=[whole(a) for a in args],
        out_specs=[whole(q), whole(cache), whole(cache)],
        out_shape=[q, cache, cache],
        input_output_aliases={len(args) - 2: 1, len(args) - 1: 2},
        compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
        name="ninfer_attention_prologue",
    )(*args))


def _prologue_kernel(slots_ref, qkv_ref, cos_ref, sin_ref, *refs, num_heads: int,
                     num_kv_heads: int, eps: float, normed: bool):
    norm_ref = refs[0] if normed else None
    q_ref, k_out, v_out = refs[-3:]
    token, head = pl.program_id(0), pl.program_id(1)
    D = q_ref.shape[2]
    half = D // 2
    lower, upper = pl.ds(0, half), pl.ds(half, half)
    cos, sin = cos_ref[token, lower], sin_ref[token, lower]

    def rotated(column, which):
        """The head at qkv column `column`, normed with norm row `which`, rotated: both halves
        rounded to qkv's dtype as the model rounds them."""
        x1 = qkv_ref[token, pl.ds(column, half)].astype(jnp.float32)
        x2 = qkv_ref[token, pl.ds(column + half, half)].astype(jnp.float32)
        if norm_ref is not None:
            scale = lax.rsqrt((jnp.sum(x1 * x1) + jnp.sum(x2 * x2)) / D + eps)
            round_ = lambda a: a.astype(qkv_ref.dtype).astype(jnp.float32)  # noqa: E731
            x1 = round_(x1 * scale * norm_ref[which, lower])
            x2 = round_(x2 * scale * norm_ref[which, upper])
        return x1 * cos - x2 * sin, x2 * cos + x1 * sin

    @pl.when(head < num_heads)
    def _query():
        r1, r2 = rotated(head * D, 0)
        q_ref[token, head, lower] = r1.astype(q_ref.dtype)
        q_ref[token, head, upper] = r2.astype(q_ref.dtype)

    @pl.when(head >= num_heads)
    def _key_value():
        kv_head = head - num_heads
        slot = slots_ref[token]
        S = k_out.shape[2]
        page, offset = slot // S, slot % S

        @pl.when((slot >= 0) & (page < k_out.shape[0]))
        def _store():
            r1, r2 = rotated((num_heads + kv_head) * D, 1)
            k_out[page, kv_head, offset, lower] = r1.astype(qkv_ref.dtype).astype(k_out.dtype)
            k_out[page, kv_head, offset, upper] = r2.astype(qkv_ref.dtype).astype(k_out.dtype)
            v = qkv_ref[token, pl.ds((num_heads + num_kv_heads + kv_head) * D, D)]
            v_out[page, kv_head, offset, pl.ds(0, D)] = v.astype(v_out.dtype)
