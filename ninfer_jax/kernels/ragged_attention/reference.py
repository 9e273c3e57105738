"""Pure-jnp reference twin of the ragged paged attention (the CPU path and the test oracle).

One call serves a ragged step's two query regions, laid out back to back in q [C + B, H, D]:
  chunk region  q[:C]   one sequence's prefill chunk at positions chunk_start..chunk_start+C-1,
                        causal over that sequence's pages (`chunk_table` [W]);
  row region    q[C:]   B independent query tokens; row i sees keys 0..row_lengths[i]-1
                        through its own table `row_tables[i]` [W].
Rows are independent, so several consecutive tokens of one sequence (a speculative verify row)
are simply rows with the same table and lengths p+1, p+2, ...; padding rows carry an all
DUMMY_PAGE table and length 1. C is static (`num_chunk_tokens`); either region may be empty.
Every query's own K/V must already be in the cache (the model writes all of them first).

The reference composes paged_attention's two references rather than one new loop: the chunk
needs a flash-style causal pass over one sequence, the rows a per-token decode pass, and those
already exist (with their block walk that stops at the last key a query may see). The cache
layout is paged_attention's ([P, K, S, D], page DUMMY_PAGE never owned).
Shape letters: C chunk tokens, B row tokens, H query heads, D head dim, W page-table width.
"""
from __future__ import annotations

import jax.numpy as jnp

from ninfer_jax.kernels.paged_attention import reference as paged


def ragged_paged_attention(q, k_cache, v_cache, *, chunk_table, chunk_start, row_tables,
                           row_lengths, scale: float, num_chunk_tokens: int,
                           window: int | None = None):
    """q [C + B, H, D] -> [C + B, H, D] in q's dtype. Chunk rows past the chunk's real length
    are padding: their output is unspecified (as in paged_prefill_attention). `window`: every
    query sees only its last `window` keys (sliding-window layers)."""
    return compose(
        q, num_chunk_tokens,
        chunk=lambda qc: paged.paged_prefill_attention(qc, k_cache, v_cache, chunk_table,
                                                       chunk_start, scale=scale, window=window),
        rows=lambda qr: paged.paged_decode_attention(qr, k_cache, v_cache, row_tables,
                                                     row_lengths, scale=scale, window=window))


def compose(q, num_chunk_tokens: int, *, chunk, rows):
    """Split q at the static region boundary, run `chunk(q[:C])` and `rows(q[C:])` on the
    regions that are not empty, and join the outputs in q's order. Shared with kernel.py."""
    C = num_chunk_tokens
    if not 0 <= C <= q.shape[0]:
        raise ValueError(f"num_chunk_tokens={C} outside 0..{q.shape[0]}")
    parts = []
    if C > 0:
        parts.append(chunk(q[:C]))
    if q.shape[0] > C:
        parts.append(rows(q[C:]))
    if not parts:
        return q
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=0)
