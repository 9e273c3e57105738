"""Sliding-window ragged attention (Gemma's local layers) as one gather per query region.

The signature and the result of reference.ragged_paged_attention with a `window`; the path
every backend runs for windowed layers. A query at position p sees keys p - window + 1 .. p,
which lie in at most (window - 1) // S + 2 pages of its table, so each decode row gathers that
fixed span of pages (and the chunk the span of its first query's window through its last
position) and attends over it in one masked softmax. The reference walks the table block by
block in a loop whose trip count depends on the lengths; on a GPU every iteration of such a
loop costs a round trip to the host for its condition and several small launches, and a
31B Gemma decode step has 50 windowed layers of about 17 blocks each. Here the work is a
few fused ops of static shape, and what is read grows with the window, not the context.

The span may reach past a row's own position (into pages not written yet, the table's
DUMMY_PAGE padding, or a ring's aliased pages: model/gemma.py), and those keys are masked by
position like every key outside the window; a span page past the table's width is clamped
to its last entry and masked too.
Shape letters: as reference.py; G query groups (decode rows, or the one chunk), Q queries per
group, M pages in a span.
"""
from __future__ import annotations

import jax.numpy as jnp

from ninfer_jax.kernels.paged_attention import reference as paged
from ninfer_jax.kernels.ragged_attention import reference


def ragged_paged_attention(q, k_cache, v_cache, *, chunk_table, chunk_start, row_tables,
                           row_lengths, scale: float, num_chunk_tokens: int, window: int):
    """q [C + B, H, D] -> [C + B, H, D]; see reference.ragged_paged_attention (`window` is
    required here). A segmented chunk (a chunk_table [G, W]) is refused."""
    if chunk_table.ndim != 1:
        raise NotImplementedError(
            f"windowed ragged attention takes one chunk (chunk_table [W]), not segments "
            f"(chunk_table {tuple(chunk_table.shape)}); sliding-window models (Gemma) are "
            f"scheduled one prefill chunk per step")
    page_size = k_cache.shape[2]

    def chunk(qc):
        T = qc.shape[0]
        positions = chunk_start + jnp.arange(T, dtype=jnp.int32)
        span = (window + T - 2) // page_size + 2
        out = _span_attention(qc[None], k_cache, v_cache, chunk_table[None], positions[None],
                              span, window, scale)
        return out[0]

    def rows(qr):
        span = (window - 1) // page_size + 2
        out = _span_attention(qr[:, None], k_cache, v_cache, row_tables,
                              (row_lengths - 1)[:, None], span, window, scale)
        return out[:, 0]

    return reference.compose(q, num_chunk_tokens, chunk=chunk, rows=rows)


def _span_attention(q, k_cache, v_cache, tables, positions, span: int, window: int,
                    scale: float):
    """q [G, Q, H, D] at `positions` [G, Q] (ascending within a group) over the `span` pages
    of tables [G, W] from the page of the group's first query's window -> [G, Q, H, D]."""
    G, Q, H, D = q.shape
    # A padding chunk query may sit past the table; masking at the table's last key keeps
    # one visible key (itself clamped) so its unspecified output is at least finite.
    positions = jnp.minimum(positions, tables.shape[1] * k_cache.shape[2] - 1)
    scores, v = window_span_scores(q, k_cache, v_cache, tables, positions, positions,
                                   span=span, window=window, scale=scale)
    peak = jnp.max(scores, axis=(-2, -1), keepdims=True)
    probs = jnp.exp(scores - jnp.where(jnp.isfinite(peak), peak, 0.0))
    out = jnp.einsum("gqkhms,gmksd->gqkhd", probs.astype(q.dtype), v,
                     preferred_element_type=jnp.float32)
    out = out / jnp.sum(probs, axis=(-2, -1))[..., None]
    return out.reshape(G, Q, H, D).astype(q.dtype)


def window_span_scores(q, k_cache, v_cache, tables, positions, last_keys, *, span: int,
                       window: int, scale: float):
    """The masked scores of a window's page span (shared with the DFlash2 drafter's block
    attention, paged_attention/block.py).

    q [G, Q, H, D] at `positions` [G, Q] (ascending within a group) sees the keys
    positions - window + 1 .. last_keys [G, Q] among the `span` pages of tables [G, W] from
    the page of the group's first query's window. -> (scores f32 [G, Q, K, H/K, M, S], -inf
    where masked; the span's values [G, M, K, S, D] in q's dtype)."""
    G, Q, H, D = q.shape
    K, S = k_cache.shape[1], k_cache.shape[2]
    width = tables.shape[1]
    first = jnp.maximum(positions[:, 0] - window + 1, 0) // S  # [G]
    logical = first[:, None] + jnp.arange(span, dtype=jnp.int32)  # [G, M]
    pages = jnp.take_along_axis(tables, jnp.minimum(logical, width - 1), axis=1)
    # Keys and values gathered in q's dtype (the compute dtype: bf16 on a GPU, f32 on the
    # CPU), products summed in f32, as the decode kernel does: an f32 copy of the span would
    # double what the gather writes and the dots read.
    k = paged.widen(paged.take_pages(k_cache, pages), q.dtype)  # [G, M, K, S, D]
    v = paged.widen(paged.take_pages(v_cache, pages), q.dtype)
    keys = logical[:, :, None] * S + jnp.arange(S, dtype=jnp.int32)  # [G, M, S]
    visible = ((keys[:, None] <= last_keys[:, :, None, None])
               & (keys[:, None] > positions[:, :, None, None] - window)
               & (logical < width)[:, None, :, None])  # [G, Q, M, S]
    qg = (q.reshape(G, Q, K, H // K, D).astype(jnp.float32) * scale).astype(q.dtype)
    scores = jnp.einsum("gqkhd,gmksd->gqkhms", qg, k, preferred_element_type=jnp.float32)
    return jnp.where(visible[:, :, None, None], scores, -jnp.inf), v
