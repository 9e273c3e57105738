"""Ragged paged attention: one prefill chunk plus independent row tokens in one call,
dispatched at trace time (kernels/dispatch.py).

On a GPU backend it runs kernel.py (the cuDNN prefill for the chunk, the Pallas decode kernel
for the rows); on the CPU the rows and the chunk's queries (as rows: chunk_as_rows) run the
C++ decode attention when it is built and takes the pages (paged_attention/cpu); everywhere
else, and whenever
NINFER_FORCE_REFERENCE=1, reference.py. Both share
the signature and paged_attention's cache layout (write K/V with paged_attention.write_kv).
A sliding `window` (Gemma's local layers) runs windowed.py on every backend (one gather of
the pages a window spans; the reference when forced): the GPU kernels take no window, and
windowed.py takes no segmented chunk (Gemma never schedules one).
"""
from __future__ import annotations

import jax.numpy as jnp

from ninfer_jax.kernels import paged_attention
from ninfer_jax.kernels.dispatch import forced_reference, use_kernels
from ninfer_jax.kernels.paged_attention import reference as paged_reference
from ninfer_jax.kernels.ragged_attention import reference, windowed


def chunk_as_rows(chunk_table, chunk_start, num_tokens: int, page_size: int):
    """A chunk's queries as decode rows: (tables [T, W], lengths [T]), query i seeing keys
    0..chunk_start + i, its K/V written first, as causal prefill does. On the CPU the chunk
    runs the decode rows' own C++ attention, so a token's output has the same bits whether
    it was prefilled in a chunk of any size, after a cached prefix, or decoded: with 8-bit
    activation blocks (the block artifact) XLA's chunk attention, whose summation order
    depends on the chunk's shape, made a request whose prompt came back from the context
    cache decode other greedy tokens than the same request before. Padding rows past the
    chunk's real tokens read keys the table covers (it covers start + T - 1) and are unused.
    A segmented chunk (chunk_table [G, W], chunk_start [G]) gives each segment's T // G
    queries its own table and lengths chunk_start[g] + i + 1."""
    per_segment = reference.queries_per_segment(num_tokens, chunk_table)
    width = chunk_table.shape[-1]
    tables = jnp.reshape(chunk_table, (-1, width))  # [G, W]; one chunk is one segment
    starts = jnp.reshape(chunk_start, (-1, 1)).astype(jnp.int32)  # [G, 1]
    lengths = jnp.minimum(starts + jnp.arange(per_segment, dtype=jnp.int32) + 1,
                          width * page_size)
    return jnp.repeat(tables, per_segment, axis=0), lengths.reshape(-1)


def ragged_paged_attention(q, k_cache, v_cache, *, chunk_table, chunk_start, row_tables,
                           row_lengths, scale: float, num_chunk_tokens: int,
                           window: int | None = None):
    """Chunk region q[:C] causal over its sequence (or each of its segments over its own),
    row region q[C:] one query per row; see reference.ragged_paged_attention."""
    args = dict(chunk_table=chunk_table, chunk_start=chunk_start, row_tables=row_tables,
                row_lengths=row_lengths, scale=scale, num_chunk_tokens=num_chunk_tokens)
    if window is not None:
        if forced_reference():
            return reference.ragged_paged_attention(q, k_cache, v_cache, window=window, **args)
        return windowed.ragged_paged_attention(q, k_cache, v_cache, window=window, **args)
    if use_kernels():
        from ninfer_jax.kernels.ragged_attention import kernel
        return kernel.ragged_paged_attention(q, k_cache, v_cache, **args)
    if paged_attention.cpu_decode_ready(k_cache, v_cache):
        from ninfer_jax.kernels.paged_attention import cpu
        return reference.compose(
            q, num_chunk_tokens,
            chunk=lambda qc: cpu.paged_decode_attention(
                qc, k_cache, v_cache, *chunk_as_rows(chunk_table, chunk_start, qc.shape[0],
                                                     k_cache.shape[2]), scale=scale),
            rows=lambda qr: cpu.paged_decode_attention(qr, k_cache, v_cache, row_tables,
                                                       row_lengths, scale=scale))
    return reference.ragged_paged_attention(q, k_cache, v_cache, **args)
