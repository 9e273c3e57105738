"""Paged PREFILL attention on GPU: cuDNN flash attention over gathered pages.

Same signature as reference.paged_prefill_attention, plus a batch of segments. A chunk of T
queries at positions start..start+T-1 attends to (a) the context before the chunk, positions
0..start-1, with no mask but a key length of `start`, and (b) its own T keys with an ordinary
causal mask. Each part is one call of jax.nn.dot_product_attention (cuDNN's fused kernel on
GPU, measured at 469 TFLOP/s on the H200 for a 4k causal prompt), asked for its log-sum-exp,
and the two parts are merged exactly with those. Splitting this way keeps cuDNN's top-left
causal mask correct for a chunk that starts mid-sequence, which a single call could not express.

Segments (several sequences' chunks of T queries each: q [B, T, H, D], page_table [B, W],
start [B]) ride the attention call's batch axis, each with its own context key length, so
B segments still cost two launches per layer, not 2B. Their contexts are gathered to the
table's full width W each (B * W * S keys per part), the price of one call.

Implementation "xla" runs the same two-part path on any backend; tests use it on CPU to check
the split-and-merge logic against the reference.
Shape letters: B segments, T queries per segment, H query heads, K kv heads, D head dim,
W page-table width, S page size.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ninfer_jax.kernels.paged_attention.reference import _gather, widen

NEG_LARGE = -1e30  # log-sum-exp of an empty context part


def _own_keys(cache, page_table, start, T, dtype):
    """Cache rows of each segment's own positions start..start+T-1: page_table [B, W],
    start [B] -> [B, T, K, D] in `dtype`. Padding positions past the table clip to its last
    page (their queries' outputs are unspecified)."""
    page_size = cache.shape[2]
    positions = start[:, None] + jnp.arange(T)  # [B, T]
    pages = jnp.take_along_axis(page_table, positions // page_size, axis=1, mode="clip")
    offsets = positions % page_size
    return widen(jax.tree.map(lambda leaf: leaf[pages, :, offsets], cache), dtype)


def _attend(q, k, v, *, scale, is_causal, kv_lengths, implementation):
    """q [B, T, H, D], k/v [B, L, K, D], kv_lengths [B] or None
    -> (out [B, T, H, D] f32, lse [B, T, H] f32)."""
    lengths = None if kv_lengths is None else kv_lengths.astype(jnp.int32)
    out, lse = jax.nn.dot_product_attention(
        q, k, v, scale=scale, is_causal=is_causal, key_value_seq_lengths=lengths,
        implementation=implementation, return_residual=True)
    return out.astype(jnp.float32), lse.astype(jnp.float32)


def paged_prefill_attention(q, k_cache, v_cache, page_table, start, *, scale: float,
                            implementation: str = "cudnn"):
    """Causal attention for one chunk, q [T, H, D], page_table [W], start scalar -> [T, H, D]
    (see reference.py); or for B segments at once, q [B, T, H, D], page_table [B, W],
    start [B] -> [B, T, H, D], segment b's queries at start[b]..start[b]+T-1 of the sequence
    whose pages page_table[b] lists."""
    if page_table.ndim == 1:
        out = paged_prefill_attention(q[None], k_cache, v_cache, page_table[None],
                                      jnp.reshape(start, (1,)), scale=scale,
                                      implementation=implementation)
        return out[0]
    T = q.shape[1]
    dtype = q.dtype
    start = jnp.asarray(start, jnp.int32)
    k_own = _own_keys(k_cache, page_table, start, T, dtype)
    v_own = _own_keys(v_cache, page_table, start, T, dtype)
    out_own, lse_own = _attend(q, k_own, v_own, scale=scale, is_causal=True, kv_lengths=None,
                               implementation=implementation)
    # The context part reads every page of each table; keys at or past the segment's start
    # are masked by its key length. An empty context (start == 0) gives garbage that the merge
    # drops.
    k_ctx = jnp.moveaxis(_gather(k_cache, page_table, dtype), 1, 2)  # [B, W*S, K, D]
    v_ctx = jnp.moveaxis(_gather(v_cache, page_table, dtype), 1, 2)
    out_ctx, lse_ctx = _attend(q, k_ctx, v_ctx, scale=scale, is_causal=False,
                               kv_lengths=jnp.maximum(start, 1),
                               implementation=implementation)
    has_context = (start > 0)[:, None, None]  # [B, 1, 1]
    lse_ctx = jnp.where(has_context, lse_ctx, NEG_LARGE)
    out_ctx = jnp.where(has_context[..., None], out_ctx, 0.0)
    top = jnp.maximum(lse_own, lse_ctx)
    w_own, w_ctx = jnp.exp(lse_own - top), jnp.exp(lse_ctx - top)
    out = (w_own[..., None] * out_own + w_ctx[..., None] * out_ctx) / (w_own + w_ctx)[..., None]
    return out.astype(dtype)
