"""Ragged paged attention on GPU, same signature as reference.py (plus kernel-only options).

This is deliberately not a new Pallas kernel: it composes paged_attention's GPU pieces, the
chunk region through the cuDNN two-part prefill (paged_attention/prefill.py) and the row region
through the split-K Pallas decode kernel (paged_attention/kernel.py; a cache pair it does not
read, kernel.supports, through paged_attention's reference). The two regions want
different work splits: a chunk is many queries of one sequence, best served by flash
attention tiled over queries and keys; rows are single queries of many sequences, best served
by one program per (row, kv head, context split). One fused kernel would have to pick one split
for both. Both calls read the same donated caches and run in the same compiled step, so the
composition costs two launches, not a host round trip. A segmented chunk (G sequences' chunks,
chunk_table [G, W]) rides the prefill's batch axis, so it too costs two cuDNN launches, not 2G.

Kernel-only options: `interpret` runs the Pallas decode in interpret mode and
`prefill_implementation="xla"` runs the two-part prefill through XLA (both for CPU tests);
`decode_tuning` overrides the decode block sizes. When cuDNN rejects a shape while tracing
(head dims, dtypes) the chunk falls back to the reference, as paged_attention's dispatch does.
"""
from __future__ import annotations

import logging

from ninfer_jax.kernels.paged_attention import kernel as decode_kernel
from ninfer_jax.kernels.paged_attention import prefill, reference as paged_reference
from ninfer_jax.kernels.paged_attention.tuning import DecodeTuning
from ninfer_jax.kernels.ragged_attention import reference

log = logging.getLogger(__name__)


def ragged_paged_attention(q, k_cache, v_cache, *, chunk_table, chunk_start, row_tables,
                           row_lengths, scale: float, num_chunk_tokens: int,
                           interpret: bool = False, prefill_implementation: str = "cudnn",
                           decode_tuning: DecodeTuning | None = None):
    """q [C + B, H, D] -> [C + B, H, D]; see reference.py for the contract."""
    def chunk(qc):
        # The prefill takes one chunk as it is and segments [G, Cs, H, D] as its batch.
        segments = qc if chunk_table.ndim == 1 else reference.segment_queries(qc, chunk_table)
        try:
            out = prefill.paged_prefill_attention(segments, k_cache, v_cache, chunk_table,
                                                  chunk_start, scale=scale,
                                                  implementation=prefill_implementation)
        except (NotImplementedError, ValueError) as err:
            log.warning("cuDNN prefill attention unavailable (%s); using the reference", err)
            return reference.chunk_attention(qc, k_cache, v_cache, chunk_table, chunk_start,
                                             scale=scale)
        return out.reshape(qc.shape)

    def rows(qr):
        if not decode_kernel.supports(k_cache, v_cache):  # a plain / quantized mix
            return paged_reference.paged_decode_attention(qr, k_cache, v_cache, row_tables,
                                                          row_lengths, scale=scale)
        return decode_kernel.paged_decode_attention(qr, k_cache, v_cache, row_tables,
                                                    row_lengths, scale=scale,
                                                    tuning=decode_tuning, interpret=interpret)

    return reference.compose(q, num_chunk_tokens, chunk=chunk, rows=rows)
