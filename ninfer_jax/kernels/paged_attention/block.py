"""The DFlash drafter's block attention without the reference's block walk.

Same signature and result as reference.paged_block_attention: T queries per row at positions
lengths + t over the row's paged keys 0..lengths-1 and the block's own T keys. The reference
walks the pages in a loop whose trip count follows the lengths, and on a GPU every iteration
of such a loop waits on the host for its condition (a 4k context is 64 iterations per drafter
layer and step). Here the two key sets are attended apart, each with its log-sum-exp, and
merged exactly:
- paged keys, no window: the Pallas decode kernel with the T queries folded into each kv
  head's group (kernel.paged_context_attention; GPU);
- paged keys, sliding `window` (DFlash2): one gather of the pages the block's windows span,
  (window - 2) // S + 2 of them whatever the context, and a masked softmax (every backend);
- the block's own keys: one small dense softmax (`causal`: key t' <= t).
Shape letters: as reference.py.
"""
from __future__ import annotations

import jax.numpy as jnp

from ninfer_jax.kernels.ragged_attention import windowed

EMPTY = -1e30  # log-sum-exp of a part with no visible key: weighs 0 in the merge


def paged_block_attention(q, k_block, v_block, k_cache, v_cache, page_table, lengths, *,
                          scale: float, window: int | None = None, causal: bool = False,
                          interpret: bool = False):
    """q [B, T, H, D] -> [B, T, H, D] in q's dtype; see reference.paged_block_attention.
    Without a window the paged part runs the Pallas kernel (`interpret` for tests off a GPU)."""
    if window is None:
        from ninfer_jax.kernels.paged_attention import kernel
        paged = kernel.paged_context_attention(q, k_cache, v_cache, page_table, lengths,
                                               scale=scale, interpret=interpret)
    else:
        paged = _window_span(q, k_cache, v_cache, page_table, lengths, scale=scale,
                             window=window)
    own = _own_keys(q, k_block, v_block, scale=scale, causal=causal)
    return _merge(paged, own).astype(q.dtype)


def _window_span(q, k_cache, v_cache, page_table, lengths, *, scale: float, window: int):
    """Paged part with a window: query t (position lengths + t) sees paged keys
    lengths + t - window + 1 .. lengths - 1. -> (out f32, lse [B, T, H])."""
    B, T, H, D = q.shape
    span = (window - 2) // k_cache.shape[2] + 2
    positions = lengths[:, None] + jnp.arange(T, dtype=jnp.int32)  # [B, T]
    last_keys = jnp.broadcast_to(lengths[:, None] - 1, (B, T))
    scores, v = windowed.window_span_scores(q, k_cache, v_cache, page_table, positions,
                                            last_keys, span=span, window=window, scale=scale)
    out, lse = _softmax_parts(
        scores, lambda probs: jnp.einsum("btkgms,bmksd->btkgd", probs.astype(q.dtype), v,
                                         preferred_element_type=jnp.float32),
        axes=(-2, -1))
    return out.reshape(B, T, H, D), lse.reshape(B, T, H)


def _own_keys(q, k_block, v_block, *, scale: float, causal: bool):
    """The block's own keys: q [B, T, H, D], k/v [B, T, K, D] -> (out f32, lse [B, T, H])."""
    B, T, H, D = q.shape
    K = k_block.shape[2]
    qg = q.reshape(B, T, K, H // K, D).astype(jnp.float32) * scale
    scores = jnp.einsum("btkgd,bskd->btkgs", qg, k_block.astype(jnp.float32))
    if causal:
        scores = jnp.where(jnp.tril(jnp.ones((T, T), bool))[None, :, None, None], scores,
                           -jnp.inf)
    vb = v_block.astype(jnp.float32)
    out, lse = _softmax_parts(scores, lambda probs: jnp.einsum("btkgs,bskd->btkgd", probs, vb),
                              axes=(-1,))
    return out.reshape(B, T, H, D), lse.reshape(B, T, H)


def _softmax_parts(scores, weigh_values, *, axes):
    """(normalised output, log-sum-exp) of masked scores (-inf); all masked: (0, EMPTY)."""
    peak = jnp.max(scores, axis=axes, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    probs = jnp.exp(scores - peak)
    total = jnp.sum(probs, axis=axes)
    out = weigh_values(probs) / jnp.maximum(total, 1e-30)[..., None]
    lse = jnp.where(total > 0, jnp.squeeze(peak, axes) + jnp.log(jnp.maximum(total, 1e-30)),
                    EMPTY)
    return out, lse


def _merge(first, second):
    """Exact softmax over the union of two disjoint key sets from each part's (out, lse)."""
    (out_a, lse_a), (out_b, lse_b) = first, second
    top = jnp.maximum(lse_a, lse_b)
    w_a, w_b = jnp.exp(lse_a - top), jnp.exp(lse_b - top)
    return (w_a[..., None] * out_a + w_b[..., None] * out_b) / (w_a + w_b)[..., None]
