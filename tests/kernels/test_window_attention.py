"""Sliding-window paged attention (Gemma's local layers): the reference's decode rows and
prefill chunk against a by-hand softmax over each query's last `window` keys, with contexts
long enough that the walk skips whole blocks before the window (BLOCK_TOKENS = 64) and rows
whose windows start in different blocks (a row may see no key in the first blocks walked);
then the path every backend runs (windowed.py: one gather of the pages a window spans)
against the reference over windows, page sizes, chunk offsets, padding rows, a ring's
aliased table and 8- and 4-bit pages."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import pytest

from ninfer_jax.kernels import ragged_attention
from ninfer_jax.kernels.paged_attention import reference
from ninfer_jax.kernels.paged_attention.reference import DUMMY_PAGE, cache_specs
from ninfer_jax.kernels.ragged_attention import reference as ragged_reference
from ninfer_jax.kernels.ragged_attention import windowed
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


def ragged_call(fn, q, k, v, *, chunk_table, chunk_start, row_tables, row_lengths, window):
    with jax.default_matmul_precision("highest"):
        return np.asarray(fn(q, k, v, chunk_table=chunk_table, chunk_start=jnp.int32(chunk_start),
                             row_tables=row_tables, row_lengths=row_lengths, scale=SCALE,
                             num_chunk_tokens=q.shape[0] - row_tables.shape[0], window=window))


@pytest.mark.parametrize("page_size,window", [(4, 37), (4, 8), (16, 64), (8, 1), (4, 400)])
def test_windowed_path_equals_the_reference(page_size, window):
    """A chunk of 9 at an odd offset plus decode rows of assorted lengths (one a padding row:
    all-DUMMY table, length 1; one whose span reaches past its table), windows narrower and
    wider than the contexts, one query (window 1) seeing only itself."""
    rng = np.random.default_rng(page_size * 1000 + window)
    lengths = [171 + 9, 1, 30, 150, 233, 3]
    k, v, table, lens = paged_setup(rng, batch=len(lengths), lengths=lengths, num_kv_heads=2,
                                    head_dim=8, page_size=page_size)
    table = table.at[1].set(DUMMY_PAGE)
    chunk_start, T = 171, 9
    q = jnp.asarray(rng.standard_normal((T + len(lengths) - 1, 4, 8)), jnp.float32)
    args = dict(chunk_table=table[0], chunk_start=chunk_start, row_tables=table[1:],
                row_lengths=lens[1:], window=window)
    fast = ragged_call(windowed.ragged_paged_attention, q, k, v, **args)
    slow = ragged_call(ragged_reference.ragged_paged_attention, q, k, v, **args)
    np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=1e-5)


def test_windowed_path_on_a_ring_table():
    """model/gemma.py's rings: logical page j of a slot's table is ring page j mod R, so a
    long sequence's table aliases its R pages; keys outside the window (older positions that
    newer ones overwrote) must stay masked. Ring written position by position up to p, and
    the chunk's queries written before they attend, as the model does."""
    rng = np.random.default_rng(7)
    S, window, R, W = 4, 10, 4, 40  # R * S = 16 >= window + step tokens - 1 (step of 7)
    q_len, start = 7, 93
    k_all = rng.standard_normal((start + q_len, 2, 8)).astype(np.float32)
    v_all = rng.standard_normal((start + q_len, 2, 8)).astype(np.float32)
    k = np.zeros((1 + R, 2, S, 8), np.float32)
    v = np.zeros_like(k)
    for p in range(start + q_len):
        k[1 + (p // S) % R, :, p % S] = k_all[p]
        v[1 + (p // S) % R, :, p % S] = v_all[p]
    ring = jnp.asarray(1 + np.arange(W) % R, jnp.int32)
    q = jnp.asarray(rng.standard_normal((q_len, 4, 8)), jnp.float32)
    out = ragged_call(windowed.ragged_paged_attention, q, jnp.asarray(k), jnp.asarray(v),
                      chunk_table=ring, chunk_start=start,
                      row_tables=jnp.zeros((0, W), jnp.int32),
                      row_lengths=jnp.zeros(0, jnp.int32), window=window)
    # by hand over the unaliased sequence
    k_pages = jnp.asarray(np.moveaxis(np.pad(k_all, ((0, -len(k_all) % S), (0, 0), (0, 0)))
                                      .reshape(-1, S, 2, 8), 1, 2))
    v_pages = jnp.asarray(np.moveaxis(np.pad(v_all, ((0, -len(v_all) % S), (0, 0), (0, 0)))
                                      .reshape(-1, S, 2, 8), 1, 2))
    plain = jnp.arange(k_pages.shape[0], dtype=jnp.int32)
    for t in range(q_len):
        np.testing.assert_allclose(out[t], by_hand(q[t], k_pages, v_pages, plain, start + t,
                                                   window), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", [jnp.int8, jnp.float8_e4m3fn, reference.K8V4,
                                      reference.NVFP4])
def test_windowed_path_reads_narrow_pages_as_the_reference(kv_dtype):
    rng = np.random.default_rng(11)
    lengths = [77, 40, 5]
    k, v, table, lens = paged_setup(rng, batch=3, lengths=lengths, num_kv_heads=2,
                                    head_dim=32, page_size=4)
    P, K, S, D = k.shape
    empty = [jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype), spec)
             for spec in cache_specs(P, S, K, D, reference.kv_format(kv_dtype))]
    tokens = [jnp.moveaxis(c, 2, 1).reshape(P * S, K, D) for c in (k, v)]
    kq, vq = jax.jit(reference.write_kv)(*empty, *tokens, jnp.arange(P * S))
    q = jnp.asarray(rng.standard_normal((5 + 2, 4, 32)), jnp.float32)
    args = dict(chunk_table=table[0], chunk_start=60, row_tables=table[1:],
                row_lengths=lens[1:], window=19)
    fast = ragged_call(windowed.ragged_paged_attention, q, kq, vq, **args)
    slow = ragged_call(ragged_reference.ragged_paged_attention, q, kq, vq, **args)
    np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=1e-5)


def test_dispatch_runs_the_windowed_path_unless_forced(monkeypatch):
    calls = []
    monkeypatch.setattr(windowed, "ragged_paged_attention",
                        lambda *a, **kw: calls.append("windowed") or a[0])
    monkeypatch.setattr(ragged_reference, "ragged_paged_attention",
                        lambda *a, **kw: calls.append("reference") or a[0])
    q = jnp.zeros((1, 2, 8), jnp.float32)
    k = jnp.zeros((2, 1, 4, 8), jnp.float32)
    args = dict(chunk_table=jnp.zeros(1, jnp.int32), chunk_start=jnp.int32(0),
                row_tables=jnp.zeros((1, 1), jnp.int32), row_lengths=jnp.ones(1, jnp.int32),
                scale=1.0, num_chunk_tokens=0, window=4)
    ragged_attention.ragged_paged_attention(q, k, k, **args)
    monkeypatch.setenv("NINFER_FORCE_REFERENCE", "1")
    ragged_attention.ragged_paged_attention(q, k, k, **args)
    assert calls == ["windowed", "reference"]


def test_windowed_path_in_bf16_stays_near_the_f32_reference():
    """bf16 queries and pages (the GPU's compute dtype): the span is gathered and multiplied
    in bf16 with f32 sums, within bf16's rounding of the reference's f32 math."""
    rng = np.random.default_rng(12)
    lengths = [300, 57, 1]
    k, v, table, lens = paged_setup(rng, batch=3, lengths=lengths, num_kv_heads=2, head_dim=64,
                                    page_size=16, dtype=jnp.bfloat16)
    q = jnp.asarray(rng.standard_normal((8 + 2, 4, 64)), jnp.bfloat16)
    args = dict(chunk_table=table[0], chunk_start=200, row_tables=table[1:],
                row_lengths=lens[1:], window=100)
    fast = ragged_call(windowed.ragged_paged_attention, q, k, v, **args)
    exact = ragged_call(ragged_reference.ragged_paged_attention, q.astype(jnp.float32),
                        k.astype(jnp.float32), v.astype(jnp.float32), **args)
    assert fast.dtype == jnp.bfloat16
    np.testing.assert_allclose(fast.astype(np.float32), exact, atol=3e-2, rtol=3e-2)
