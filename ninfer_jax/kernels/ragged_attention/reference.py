"""Pure-jnp reference twin of the ragged paged attention (the CPU path and the test oracle).

One call serves a ragged step's two query regions, laid out back to back in q [C + B, H, D]:
  chunk region  q[:C]   prefill chunks, causal over their sequences' pages, either
                        one sequence's chunk at positions chunk_start..chunk_start+C-1
                        (`chunk_table` [W], `chunk_start` a scalar), or
                        G segments of Cs = C // G queries each (`chunk_table` [G, W],
                        `chunk_start` [G]): segment g is q[g*Cs:(g+1)*Cs] at positions
                        chunk_start[g]..chunk_start[g]+Cs-1 of the sequence chunk_table[g],
                        so several prompts prefill in one step;
  row region    q[C:]   B independent query tokens; row i sees keys 0..row_lengths[i]-1
                        through its own table `row_tables[i]` [W].
Rows are independent, so several consecutive tokens of one sequence (a speculative verify row)
are simply rows with the same table and lengths p+1, p+2, ...; padding rows carry an all
DUMMY_PAGE table and length 1, a padding segment an all DUMMY_PAGE table and start 0. Chunk
queries past a chunk's (segment's) real length are padding too. C is static
(`num_chunk_tokens`, a multiple of G); either region may be empty.
Every query's own K/V must already be in the cache (the model writes all of them first).

The reference composes paged_attention's two references rather than one new loop: the chunk
needs a flash-style causal pass over one sequence, the rows a per-token decode pass, and those
already exist (with their block walk that stops at the last key a query may see). Segments
run that chunk pass one after another (a static loop: G is small, and each segment's walk
stops at its own last key). The cache layout is paged_attention's ([P, K, S, D], page
DUMMY_PAGE never owned).
Shape letters: C chunk tokens, G segments, Cs = C // G queries per segment, B row tokens,
H query heads, D head dim, W page-table width.
"""
from __future__ import annotations

import jax.numpy as jnp

from ninfer_jax.kernels.paged_attention import reference as paged


def ragged_paged_attention(q, k_cache, v_cache, *, chunk_table, chunk_start, row_tables,
                           row_lengths, scale: float, num_chunk_tokens: int,
                           window: int | None = None):
    """q [C + B, H, D] -> [C + B, H, D] in q's dtype. Chunk rows past the chunk's (a
    segment's) real length are padding: their output is unspecified (as in
    paged_prefill_attention). `window`: every query sees only its last `window` keys
    (sliding-window layers)."""
    return compose(
        q, num_chunk_tokens,
        chunk=lambda qc: chunk_attention(qc, k_cache, v_cache, chunk_table, chunk_start,
                                         scale=scale, window=window),
        rows=lambda qr: paged.paged_decode_attention(qr, k_cache, v_cache, row_tables,
                                                     row_lengths, scale=scale, window=window))


def chunk_attention(qc, k_cache, v_cache, chunk_table, chunk_start, *, scale: float,
                    window: int | None = None):
    """The chunk region qc [C, H, D] -> [C, H, D]: one chunk (chunk_table [W]) or G segments
    (chunk_table [G, W], chunk_start [G]), each through paged_prefill_attention."""
    if chunk_table.ndim == 1:
        return paged.paged_prefill_attention(qc, k_cache, v_cache, chunk_table, chunk_start,
                                             scale=scale, window=window)
    segments = segment_queries(qc, chunk_table)
    return jnp.concatenate([
        paged.paged_prefill_attention(segments[g], k_cache, v_cache, chunk_table[g],
                                      chunk_start[g], scale=scale, window=window)
        for g in range(segments.shape[0])])


def segment_queries(qc, chunk_table):
    """qc [C, H, D] -> [G, Cs, H, D] for a segmented chunk_table [G, W]."""
    if chunk_table.ndim != 2:
        raise ValueError(f"segments need a chunk_table [G, W], not shape {chunk_table.shape}")
    return qc.reshape(-1, queries_per_segment(qc.shape[0], chunk_table), *qc.shape[1:])


def queries_per_segment(num_chunk_tokens: int, chunk_table) -> int:
    """Cs: C for one chunk (chunk_table [W]), C // G for G segments (C a multiple of G)."""
    if chunk_table.ndim == 1:
        return num_chunk_tokens
    num_segments = chunk_table.shape[0]
    if num_segments == 0 or num_chunk_tokens % num_segments:
        raise ValueError(f"num_chunk_tokens={num_chunk_tokens} does not split into "
                         f"{num_segments} equal segments")
    return num_chunk_tokens // num_segments


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
