"""Ragged paged attention: one prefill chunk plus independent row tokens in one call,
dispatched at trace time (kernels/dispatch.py).

On a GPU backend it runs kernel.py (the cuDNN prefill for the chunk, the Pallas decode kernel
for the rows); on the CPU the rows run the C++ decode attention over f32 pages when it is
built (paged_attention/cpu; the chunk stays the reference's); everywhere else, and whenever
NINFER_FORCE_REFERENCE=1, reference.py. Both share
the signature and paged_attention's cache layout (write K/V with paged_attention.write_kv).
A sliding `window` (Gemma's local layers) runs the reference on every backend: the GPU
kernels take no window yet.
"""
from __future__ import annotations

from ninfer_jax.kernels import paged_attention
from ninfer_jax.kernels.dispatch import use_kernels
from ninfer_jax.kernels.paged_attention import reference as paged_reference
from ninfer_jax.kernels.ragged_attention import reference


def ragged_paged_attention(q, k_cache, v_cache, *, chunk_table, chunk_start, row_tables,
                           row_lengths, scale: float, num_chunk_tokens: int,
                           window: int | None = None):
    """Chunk region q[:C] causal over its sequence, row region q[C:] one query per row;
    see reference.ragged_paged_attention."""
    args = dict(chunk_table=chunk_table, chunk_start=chunk_start, row_tables=row_tables,
                row_lengths=row_lengths, scale=scale, num_chunk_tokens=num_chunk_tokens)
    if window is not None:
        return reference.ragged_paged_attention(q, k_cache, v_cache, window=window, **args)
    if use_kernels():
        from ninfer_jax.kernels.ragged_attention import kernel
        return kernel.ragged_paged_attention(q, k_cache, v_cache, **args)
    if paged_attention.cpu_decode_ready(k_cache, v_cache):
        from ninfer_jax.kernels.paged_attention import cpu
        return reference.compose(
            q, num_chunk_tokens,
            chunk=lambda qc: paged_reference.paged_prefill_attention(
                qc, k_cache, v_cache, chunk_table, chunk_start, scale=scale),
            rows=lambda qr: cpu.paged_decode_attention(qr, k_cache, v_cache, row_tables,
                                                       row_lengths, scale=scale))
    return reference.ragged_paged_attention(q, k_cache, v_cache, **args)
