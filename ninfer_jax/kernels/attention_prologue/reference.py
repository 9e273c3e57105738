"""Pure-jnp twin of kernel.py: the attention prologue with the model's roundings."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def attention_prologue(qkv, q_norm, k_norm, cos, sin, slots, k_cache, v_cache, *,
                       num_heads: int, num_kv_heads: int, eps: float):
    """qkv [N, (NH + 2 NK) D] (q, k, v heads in that order), q_norm / k_norm [D] or None (no
    QK-norm), cos / sin f32 [N, D/2], slots int32 [N] (page * S + offset), caches
    [P, NK, S, D] -> (q [N, NH, D] in qkv's dtype, k_cache, v_cache with row n's rotated k and
    its v at slots[n]; a slot outside the pages writes nothing). As the model computes it:
    the norm in f32 rounded to qkv's dtype, then the rotate-half RoPE in f32, rounded again."""
    N = qkv.shape[0]
    D = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    heads = qkv.reshape(N, num_heads + 2 * num_kv_heads, D)
    q, k = heads[:, :num_heads], heads[:, num_heads:num_heads + num_kv_heads]
    v = heads[:, num_heads + num_kv_heads:]
    q, k = _norm(q, q_norm, eps), _norm(k, k_norm, eps)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    P, _, S, _ = k_cache.shape
    pages, offsets = slots // S, slots % S
    pages = jnp.where((pages >= 0) & (pages < P), pages, P)  # P: dropped by the scatter
    write = lambda cache, new: cache.at[pages, :, offsets, :].set(  # noqa: E731
        new.astype(cache.dtype), mode="drop")
    return q, write(k_cache, k), write(v_cache, v)


def _norm(x, weight, eps):
    if weight is None:
        return x
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32)).astype(x.dtype)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)
