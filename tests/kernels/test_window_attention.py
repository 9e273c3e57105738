"""Sliding-window paged attention (Gemma's local layers) in the reference: decode rows and a
prefill chunk against a by-hand softmax over each query's last `window` keys, with contexts
long enough that the walk skips whole blocks before the window (BLOCK_TOKENS = 64) and rows
whose windows start in different blocks (a row may see no key in the first blocks walked)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.kernels.paged_attention import reference
from ninfer_jax.kernels.ragged_attention import reference as ragged_reference
from kernel_testkit import paged_setup

PAGE_SIZE, WINDOW, SCALE = 4, 37, 0.3


def by_hand(q, k, v, table_row, position, window):
    """Attention of q [H, D] at `position` over keys max(0, p - window + 1)..p (float64)."""
    kn, vn = np.asarray(k, np.float64), np.asarray(v, np.float64)
    keys = np.arange(max(0, position - window + 1), position + 1)
    pages, slots = np.asarray(table_row)[keys // PAGE_SIZE], keys % PAGE_SIZE
    group = q.shape[0] // kn.shape[1]
    out = np.zeros(q.shape)
    for h in range(q.shape[0]):
        logits = kn[pages, h // group, slots] @ np.asarray(q[h], np.float64) * SCALE
        weights = np.exp(logits - logits.max())
        out[h] = weights @ vn[pages, h // group, slots] / weights.sum()
    return out


def test_windowed_decode_rows_see_only_their_window():
    rng = np.random.default_rng(3)
    lengths = [30, 150, 233]  # windows start in blocks 0, 1 and 3
    k, v, table, lens = paged_setup(rng, batch=3, lengths=lengths, num_kv_heads=2, head_dim=8,
                                    page_size=PAGE_SIZE)
    q = jnp.asarray(rng.standard_normal((3, 4, 8)), jnp.float32)
    with jax.default_matmul_precision("highest"):
        out = np.asarray(reference.paged_decode_attention(q, k, v, table, lens, scale=SCALE,
                                                          window=WINDOW))
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(out[b], by_hand(q[b], k, v, table[b], n - 1, WINDOW),
                                   atol=1e-5, rtol=1e-5)


def test_windowed_chunk_through_the_ragged_reference():
    rng = np.random.default_rng(4)
    k, v, table, _ = paged_setup(rng, batch=1, lengths=[260], num_kv_heads=1, head_dim=8,
                                 page_size=PAGE_SIZE)
    start, T = 171, 9  # keys from 135: the walk starts at block 2
    q = jnp.asarray(rng.standard_normal((T, 2, 8)), jnp.float32)
    with jax.default_matmul_precision("highest"):
        out = np.asarray(ragged_reference.ragged_paged_attention(
            q, k, v, chunk_table=table[0], chunk_start=jnp.int32(start),
            row_tables=jnp.zeros((0, table.shape[1]), jnp.int32),
            row_lengths=jnp.zeros(0, jnp.int32), scale=SCALE, num_chunk_tokens=T,
            window=WINDOW))
    for t in range(T):
        np.testing.assert_allclose(out[t], by_hand(q[t], k, v, table[0], start + t, WINDOW),
                                   atol=1e-5, rtol=1e-5)
