"""The DFlash drafter's block attention (T queries per row over the row's pages and the
block's own keys): the reference against a by-hand float64 softmax, then block.py's paths
against the reference: the decode kernel with the block folded into each kv head's group
(interpret mode here, its CUDA lowering, natively on a GPU), the window's span gather, over
ragged lengths, padding rows, 8-bit pages, causal and non-causal blocks."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.kernels import paged_attention
from ninfer_jax.kernels.paged_attention import DUMMY_PAGE, block, kernel, reference
from kernel_testkit import cpu_only, lowers_for_cuda, needs_gpu, paged_setup

SCALE = 0.3


def case(rng, *, lengths, T, heads=4, kv_heads=2, head_dim=16, page_size=4,
         dtype=jnp.float32):
    k, v, table, lens = paged_setup(rng, batch=len(lengths), lengths=lengths,
                                    num_kv_heads=kv_heads, head_dim=head_dim,
                                    page_size=page_size, dtype=dtype)
    B = len(lengths)
    q = jnp.asarray(rng.standard_normal((B, T, heads, head_dim)), dtype)
    kb = jnp.asarray(rng.standard_normal((B, T, kv_heads, head_dim)), dtype)
    vb = jnp.asarray(rng.standard_normal((B, T, kv_heads, head_dim)), dtype)
    return q, kb, vb, k, v, table, lens


def by_hand(q, kb, vb, k, v, table, lengths, *, window, causal):
    """float64 softmax per (row, query, head) over its visible paged keys and block keys."""
    q, kb, vb = (np.asarray(a, np.float64) for a in (q, kb, vb))
    k, v, table = np.asarray(k, np.float64), np.asarray(v, np.float64), np.asarray(table)
    B, T, H, D = q.shape
    K, S = k.shape[1], k.shape[2]
    out = np.zeros(q.shape)
    for b in range(B):
        n = int(lengths[b])
        for t in range(T):
            first = 0 if window is None else max(0, n + t - window + 1)
            keys = np.arange(first, n)
            for h in range(H):
                kh = h // (H // K)
                kk = np.concatenate([k[table[b, keys // S], kh, keys % S],
                                     kb[b, :t + 1 if causal else T, kh]])
                vv = np.concatenate([v[table[b, keys // S], kh, keys % S],
                                     vb[b, :t + 1 if causal else T, kh]])
                logits = kk @ q[b, t, h] * SCALE
                weights = np.exp(logits - logits.max())
                out[b, t, h] = weights @ vv / weights.sum()
    return out


def call(fn, q, kb, vb, k, v, table, lens, **kw):
    with jax.default_matmul_precision("highest"):
        return np.asarray(fn(q, kb, vb, k, v, table, lens, scale=SCALE, **kw))


@pytest.mark.parametrize("window,causal", [(None, False), (None, True), (9, False), (30, True)])
def test_reference_equals_the_softmax_by_hand(window, causal):
    rng = np.random.default_rng(1)
    args = case(rng, lengths=[70, 1, 13], T=5)
    np.testing.assert_allclose(
        call(reference.paged_block_attention, *args, window=window, causal=causal),
        by_hand(*args, window=window, causal=causal), atol=1e-5, rtol=1e-5)


@cpu_only
@pytest.mark.parametrize("window,causal", [(None, False), (None, True), (1, False), (9, True),
                                           (30, False), (200, False)])
def test_block_paths_equal_the_reference(window, causal):
    """Rows of 70, 1 and 13 keys plus a padding row (all-DUMMY table, length 1); windows of
    one (no paged key visible), narrower and wider than the contexts."""
    rng = np.random.default_rng(2)
    q, kb, vb, k, v, table, lens = case(rng, lengths=[70, 1, 13, 1], T=5)
    table = table.at[3].set(DUMMY_PAGE)
    args = (q, kb, vb, k, v, table, lens)
    fast = call(block.paged_block_attention, *args, window=window, causal=causal,
                interpret=True)
    slow = call(reference.paged_block_attention, *args, window=window, causal=causal)
    np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=1e-5)


@cpu_only
def test_kernel_path_splits_many_query_rows_over_programs(monkeypatch):
    """9 queries x 2 heads per kv head = 18 rows; with 16 rows a program the block runs as two
    programs per (row, kv head), the second mostly padding."""
    monkeypatch.setattr(kernel, "MAX_CONTEXT_ROWS", 2)  # 2 * 128 / D=16: 16 rows a program
    rng = np.random.default_rng(5)
    args = case(rng, lengths=[37, 6], T=9)
    np.testing.assert_allclose(call(block.paged_block_attention, *args, interpret=True),
                               call(reference.paged_block_attention, *args),
                               atol=1e-5, rtol=1e-5)


@cpu_only
@pytest.mark.parametrize("widening", kernel.FP8_WIDEN_CHOICES)
@pytest.mark.parametrize("kv_dtype", [jnp.int8, jnp.float8_e4m3fn])
def test_kernel_path_reads_8_bit_pages_as_the_reference(kv_dtype, widening, monkeypatch):
    """Each of the decode kernel's fp8 widenings (kernel.FP8_WIDEN); float16 rounds the f32
    queries and probabilities to 11 significant bits, e4m3 to 4 and e4m3x2 to about 8
    (measured, as allclose's tolerance: float16 0.0007, e4m3x2 and e4m3qk 0.0011, e4m3
    0.052)."""
    monkeypatch.setattr(kernel, "FP8_WIDEN", widening)
    tolerance = 1e-5
    if kv_dtype == jnp.float8_e4m3fn:
        tolerance = {"float16": 2e-3, "e4m3": 0.1, "e4m3x2": 3e-3, "e4m3qk": 3e-3}.get(
            widening, tolerance)
    rng = np.random.default_rng(3)
    q, kb, vb, k, v, table, lens = case(rng, lengths=[45, 20], T=4, head_dim=32)
    P, K, S, D = k.shape
    empty = [jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype), spec)
             for spec in reference.cache_specs(P, S, K, D, kv_dtype)]
    tokens = [jnp.moveaxis(c, 2, 1).reshape(P * S, K, D) for c in (k, v)]
    kq, vq = jax.jit(reference.write_kv)(*empty, *tokens, jnp.arange(P * S))
    args = (q, kb, vb, kq, vq, table, lens)
    np.testing.assert_allclose(call(block.paged_block_attention, *args, interpret=True),
                               call(reference.paged_block_attention, *args),
                               atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("T,heads,kv_heads,head_dim", [(16, 32, 8, 128), (8, 16, 2, 128),
                                                       (4, 9, 3, 64), (16, 24, 4, 256)])
def test_context_kernel_lowers_for_cuda(T, heads, kv_heads, head_dim):
    """The folded group (T x G rows, padded to a power of two) is a tile Triton accepts."""
    rng = np.random.default_rng(0)
    k, v, table, lens = paged_setup(rng, batch=2, lengths=[300, 40], num_kv_heads=kv_heads,
                                    head_dim=head_dim, page_size=16, dtype=jnp.bfloat16)
    q = jnp.zeros((2, T, heads, head_dim), jnp.bfloat16)
    text = lowers_for_cuda(lambda *a: kernel.paged_context_attention(*a, scale=0.1),
                           q, k, v, table, lens)
    assert "ninfer_paged_decode" in text


def test_dispatch(monkeypatch):
    """A window runs block.py everywhere; no window: the kernel path on a GPU, the reference
    on the CPU; NINFER_FORCE_REFERENCE: the reference."""
    calls = []
    monkeypatch.setattr(block, "paged_block_attention",
                        lambda *a, **kw: calls.append("block") or a[0])
    monkeypatch.setattr(reference, "paged_block_attention",
                        lambda *a, **kw: calls.append("reference") or a[0])
    args = case(np.random.default_rng(0), lengths=[5], T=2)
    paged_attention.paged_block_attention(*args, scale=1.0, window=4)
    paged_attention.paged_block_attention(*args, scale=1.0)
    monkeypatch.setattr(paged_attention, "use_kernels", lambda: True)
    paged_attention.paged_block_attention(*args, scale=1.0)
    monkeypatch.setenv("NINFER_FORCE_REFERENCE", "1")
    paged_attention.paged_block_attention(*args, scale=1.0, window=4)
    assert calls == ["block", "reference", "block", "reference"]


@needs_gpu
@pytest.mark.parametrize("window", [None, 64])
def test_block_paths_natively_on_gpu(window):
    rng = np.random.default_rng(4)
    args = case(rng, lengths=[700, 1, 130, 33], T=16, heads=32, kv_heads=8, head_dim=128,
                page_size=16, dtype=jnp.bfloat16)
    fast = call(jax.jit(block.paged_block_attention, static_argnames=("scale", "window")),
                *args, window=window)
    slow = call(jax.jit(reference.paged_block_attention, static_argnames=("scale", "window")),
                *args, window=window)
    np.testing.assert_allclose(fast, slow, atol=2e-2, rtol=2e-2)
