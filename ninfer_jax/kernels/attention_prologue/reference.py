"""Pure-jnp twin of kernel.py: the attention prologue with the model's roundings."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def attention_prologue(qkv, q_norm, k_norm, cos, sin, slots, k_cache, v_cache, *,
                       num_heads: int, num_kv_heads: int, eps: float,
                       zero_centred: bool = False, gated: bool = False):
    """qkv [N, (NH (x2 gated) + 2 NK) D]: the q heads (gated: each head's D columns followed
    by its output gate's D, left for the caller), then the k and the v heads; q_norm / k_norm
    [D] or None (no QK-norm), weights as stored (zero_centred: scaled by 1 + w); cos / sin f32
    [N, R/2] for RoPE on each head's first R dims (rotate_half within them, the rest passed
    through); slots int32 [N] (page * S + offset); caches [P, NK, S, D] -> (q [N, NH, D] in
    qkv's dtype, k_cache, v_cache with row n's rotated k and its v at slots[n]; a slot outside
    the pages writes nothing). As the model computes it: the norm in f32 rounded to qkv's
    dtype, then RoPE in f32, rounded again."""
    N = qkv.shape[0]
    q_width = 2 if gated else 1
    D = qkv.shape[1] // (q_width * num_heads + 2 * num_kv_heads)
    q = qkv[:, :q_width * num_heads * D].reshape(N, num_heads, q_width * D)[..., :D]
    kv = qkv[:, q_width * num_heads * D:].reshape(N, 2 * num_kv_heads, D)
    k, v = kv[:, :num_kv_heads], kv[:, num_kv_heads:]
    q, k = _norm(q, q_norm, eps, zero_centred), _norm(k, k_norm, eps, zero_centred)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    P, _, S, _ = k_cache.shape
    pages, offsets = slots // S, slots % S
    pages = jnp.where((pages >= 0) & (pages < P), pages, P)  # P: dropped by the scatter
    write = lambda cache, new: cache.at[pages, :, offsets, :].set(  # noqa: E731
        new.astype(cache.dtype), mode="drop")
    return q, write(k_cache, k), write(v_cache, v)


def _norm(x, weight, eps, zero_centred):
    if weight is None:
        return x
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    w = weight.astype(jnp.float32)
    return (normed * ((1.0 + w) if zero_centred else w)).astype(x.dtype)


def _rotate(x, cos, sin):
    half = cos.shape[-1]
    x1 = x[..., :half].astype(jnp.float32)
    x2 = x[..., half:2 * half].astype(jnp.float32)
    cos, sin = cos[:, None, :], sin[:, None, :]
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)
    return jnp.concatenate([rotated, x[..., 2 * half:]], -1)
