"""fp8 KV pages (ScaledPages: e4m3 codes with a float32 scale per token and kv head): what
write_kv stores, and every reader (reference, two-part prefill, the Pallas decode kernel in
interpret mode, its CUDA lowering, natively on a GPU) attending over exactly the stored values."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.kernels.paged_attention import kernel, prefill, reference
from ninfer_jax.kernels.paged_attention.reference import ScaledPages, cache_specs, widen
from ninfer_jax.kernels.paged_attention.tuning import DecodeTuning
from kernel_testkit import cpu_only, lowers_for_cuda, needs_gpu, paged_setup, relative_error


def scaled_copy(cache):
    """The f32 cache [P, K, S, D] written token by token into fp8 pages by write_kv."""
    P, K, S, D = cache.shape
    empty = jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype),
                         cache_specs(P, S, K, D, jnp.float8_e4m3fn)[0])
    tokens = jnp.moveaxis(cache, 2, 1).reshape(P * S, K, D)  # slot order: page * S + offset
    slots = jnp.arange(P * S)
    pages, _ = reference.write_kv(empty, empty, tokens, tokens, slots)
    return pages


def test_write_kv_keeps_each_vector_to_its_own_range():
    """Vectors of very different sizes (1e4, 1e-4, 0) each keep e4m3's relative precision;
    nothing overflows to NaN and a zero vector reads back as zeros."""
    rng = np.random.default_rng(0)
    magnitudes = np.array([1e4, 1.0, 1e-4, 0.0], np.float32)
    values = rng.standard_normal((4, 2, 16)).astype(np.float32) * magnitudes[:, None, None]
    cache = jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype),
                         cache_specs(3, 2, 2, 16, jnp.float8_e4m3fn)[0])
    slots = jnp.array([2, 3, 4, 5])  # pages 1 and 2
    k_cache, _ = reference.write_kv(cache, cache, jnp.asarray(values), jnp.asarray(values), slots)
    assert isinstance(k_cache, ScaledPages) and k_cache.codes.dtype == jnp.float8_e4m3fn
    stored = np.asarray(widen(k_cache))[[1, 1, 2, 2], :, [0, 1, 0, 1]]  # [4, K, D]
    assert np.isfinite(stored).all()
    absmax = np.abs(values).max(axis=-1, keepdims=True)
    assert (np.abs(stored - values) <= absmax * 2.0 ** -4).all()  # 3 mantissa bits
    assert (stored[3] == 0).all()
    assert (np.asarray(widen(k_cache))[0] == 0).all()  # the dummy page was not written


def fp8_setup(seed, lengths, *, kv_heads=2, head_dim=64, page_size=8):
    rng = np.random.default_rng(seed)
    k, v, table, lens = paged_setup(rng, batch=len(lengths), lengths=lengths,
                                    num_kv_heads=kv_heads, head_dim=head_dim,
                                    page_size=page_size)
    k8, v8 = scaled_copy(k), scaled_copy(v)
    return rng, k8, v8, widen(k8), widen(v8), table, lens


def test_reference_attends_over_exactly_the_stored_values():
    """Decode and prefill over fp8 pages equal the same reference over f32 pages holding
    the widened values: the readers apply every scale where it belongs."""
    rng, k8, v8, kw, vw, table, lens = fp8_setup(1, [37, 5, 20])
    q = jnp.asarray(rng.standard_normal((3, 8, 64)), jnp.float32)
    with jax.default_matmul_precision("float32"):
        out = reference.paged_decode_attention(q, k8, v8, table, lens, scale=0.125)
        want = reference.paged_decode_attention(q, kw, vw, table, lens, scale=0.125)
        assert relative_error(out, want) < 1e-5
        chunk = jnp.asarray(rng.standard_normal((12, 8, 64)), jnp.float32)
        for run in (reference.paged_prefill_attention,
                    functools.partial(prefill.paged_prefill_attention, implementation="xla")):
            out = run(chunk, k8, v8, table[0], jnp.int32(25), scale=0.125)
            want = run(chunk, kw, vw, table[0], jnp.int32(25), scale=0.125)
            assert relative_error(out, want) < 1e-5


@cpu_only
@pytest.mark.parametrize("merge_min_splits", [1, 10**6])
def test_decode_kernel_in_interpret_mode_reads_fp8_pages(merge_min_splits, monkeypatch):
    monkeypatch.setattr(kernel, "MERGE_KERNEL_MIN_SPLITS", merge_min_splits)
    rng, k8, v8, kw, vw, table, lens = fp8_setup(2, [29, 3, 16])
    q = jnp.asarray(rng.standard_normal((3, 8, 64)), jnp.float32)
    tuning = DecodeTuning(pages_per_block=2, pages_per_split=4,
                          num_splits=-(-table.shape[1] // 4))
    out = kernel.paged_decode_attention(q, k8, v8, table, lens, scale=0.125, tuning=tuning,
                                        interpret=True)
    want = reference.paged_decode_attention(q, kw, vw, table, lens, scale=0.125)
    assert relative_error(out, want) < 1e-5


def test_decode_kernel_on_fp8_pages_lowers_for_cuda():
    rng = np.random.default_rng(3)
    k, v, table, lens = paged_setup(rng, batch=3, lengths=[300, 5, 77], num_kv_heads=8,
                                    head_dim=128, page_size=16)
    k8, v8 = scaled_copy(k), scaled_copy(v)
    q = jnp.zeros((3, 32, 128), jnp.bfloat16)
    text = lowers_for_cuda(lambda *a: kernel.paged_decode_attention(*a, scale=0.1),
                           q, k8, v8, table, lens)
    assert "ninfer_paged_decode" in text


@needs_gpu
@pytest.mark.parametrize("lengths", [[1, 1000, 4097, 333], [384] * 64])
def test_decode_kernel_on_gpu_reads_fp8_pages(lengths):
    rng = np.random.default_rng(len(lengths))
    k, v, table, lens = paged_setup(rng, batch=len(lengths), lengths=lengths, num_kv_heads=8,
                                    head_dim=128, page_size=16)
    k8, v8 = scaled_copy(k), scaled_copy(v)
    q = jnp.asarray(rng.standard_normal((len(lengths), 32, 128)), jnp.bfloat16)
    out = kernel.paged_decode_attention(q, k8, v8, table, lens, scale=128 ** -0.5)
    want = reference.paged_decode_attention(q, widen(k8), widen(v8), table, lens,
                                            scale=128 ** -0.5)
    assert relative_error(out, want) < 2e-2
