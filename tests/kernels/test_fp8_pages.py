"""fp8 KV pages (ScaledPages: e4m3 codes with a float32 scale per token and kv head): what
write_kv stores, and every reader (reference, two-part prefill, the Pallas decode kernel in
interpret mode, its CUDA lowering, natively on a GPU) attending over exactly the stored values.
The decode kernel's ways of reading the codes (kernel.FP8_WIDEN: widened to bfloat16 or float16,
or kept for e4m3 dots) all run against the reference."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.kernels.paged_attention import kernel, prefill, reference
from ninfer_jax.kernels.paged_attention.reference import ScaledPages, cache_specs, widen
from ninfer_jax.kernels.paged_attention.tuning import DecodeTuning
from kernel_testkit import (cpu_only, kernel_equations, lowers_for_cuda, needs_gpu, paged_setup,
                            relative_error)

WIDENINGS = kernel.FP8_WIDEN_CHOICES
E4M3_DOTS = [widening for widening in WIDENINGS if widening.startswith("e4m3")]
# Interpret-mode error against the reference over the same pages (relative_error), measured on
# this file's grids: bfloat16 0 (f32 queries), float16 <= 0.0003, e4m3 0.031-0.038 (the query
# and the probabilities to 4 significant bits), e4m3x2 <= 0.0009, e4m3qk <= 0.0006; with bf16
# queries at any magnitude bfloat16 / float16 / e4m3x2 / e4m3qk <= 0.002, e4m3 <= 0.037. At
# D=128 and a 2k context: float16 0.00012, e4m3x2 0.00017, e4m3qk 0.00012, e4m3 0.014.
ERROR_BOUND = {"bfloat16": 1e-5, "float16": 1e-3, "e4m3": 6e-2, "e4m3x2": 3e-3,
               "e4m3qk": 3e-3}


def scaled_copy(cache, kv_dtype=jnp.float8_e4m3fn):
    """The f32 cache [P, K, S, D] written token by token into 8-bit pages by write_kv."""
    P, K, S, D = cache.shape
    empty = jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype),
                         cache_specs(P, S, K, D, kv_dtype)[0])
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


def small_tuning(table):
    return DecodeTuning(pages_per_block=2, pages_per_split=4, num_splits=-(-table.shape[1] // 4))


@cpu_only
@pytest.mark.parametrize("widening", WIDENINGS)
@pytest.mark.parametrize("merge_min_splits", [1, 10**6])
def test_decode_kernel_in_interpret_mode_reads_fp8_pages(merge_min_splits, widening,
                                                        monkeypatch):
    monkeypatch.setattr(kernel, "MERGE_KERNEL_MIN_SPLITS", merge_min_splits)
    monkeypatch.setattr(kernel, "FP8_WIDEN", widening)
    rng, k8, v8, kw, vw, table, lens = fp8_setup(2, [29, 3, 16])
    q = jnp.asarray(rng.standard_normal((3, 8, 64)), jnp.float32)
    out = kernel.paged_decode_attention(q, k8, v8, table, lens, scale=0.125,
                                        tuning=small_tuning(table), interpret=True)
    want = reference.paged_decode_attention(q, kw, vw, table, lens, scale=0.125)
    # float16 rounds the f32 query and the probabilities to 11 significant bits, e4m3 to 4
    assert relative_error(out, want) < ERROR_BOUND[widening]


@cpu_only
@pytest.mark.parametrize("widening", E4M3_DOTS)
@pytest.mark.parametrize("seed,lengths,kv_heads,group,head_dim,tuning", [
    (11, [61, 1, 40, 17], 2, 8, 64, DecodeTuning(pages_per_block=2, pages_per_split=4,
                                                 num_splits=2)),
    (12, [100, 33], 1, 16, 32, DecodeTuning(pages_per_block=1, pages_per_split=2,
                                            num_splits=7)),
    (13, [7, 90, 250], 4, 1, 128, DecodeTuning(pages_per_block=2, pages_per_split=2,
                                               num_splits=16)),  # the merge kernel
    (14, [33, 64], 2, 5, 64, DecodeTuning(pages_per_block=4, pages_per_split=8,
                                          num_splits=1))])
def test_e4m3_dots_keep_the_reference_over_rows_groups_and_splits(widening, seed, lengths,
                                                                   kv_heads, group, head_dim,
                                                                   tuning, monkeypatch):
    """The codes unwidened, the query and the probabilities rounded to e4m3 (one term or two)
    per row: within ERROR_BOUND at one to 16 query heads a kv head, a few pages to a whole
    page table a split, XLA's merge and the merge kernel."""
    monkeypatch.setattr(kernel, "FP8_WIDEN", widening)
    rng, k8, v8, kw, vw, table, lens = fp8_setup(seed, lengths, kv_heads=kv_heads,
                                                 head_dim=head_dim)
    q = jnp.asarray(rng.standard_normal((len(lengths), kv_heads * group, head_dim)),
                    jnp.float32)
    out = kernel.paged_decode_attention(q, k8, v8, table, lens, scale=head_dim ** -0.5,
                                        tuning=tuning, interpret=True)
    want = reference.paged_decode_attention(q, kw, vw, table, lens, scale=head_dim ** -0.5)
    assert relative_error(out, want) < ERROR_BOUND[widening]


@cpu_only
@pytest.mark.parametrize("widening", WIDENINGS)
@pytest.mark.parametrize("q_size,v_size", [(1.0, 1.0), (1e5, 1.0), (1e-6, 1.0), (1.0, 1e8),
                                           (1.0, 1e-7)])
def test_every_widening_keeps_the_reference_at_any_magnitude(widening, q_size, v_size,
                                                              monkeypatch):
    """bf16 queries (as served) of 1e5 (float16's largest is 65504) or 1e-6 (its subnormals),
    and values of 1e8 (a per-token scale of 2.2e5) or 1e-7: the float16 and e4m3 paths scale
    each query row and each block's value scales (e4m3: each row of probabilities times them)
    so that nothing overflows or underflows, and stay as close to the reference as at 1.0
    (the GPU test's bound is 2e-2)."""
    monkeypatch.setattr(kernel, "FP8_WIDEN", widening)
    rng = np.random.default_rng(5)
    k, v, table, lens = paged_setup(rng, batch=3, lengths=[29, 3, 16], num_kv_heads=2,
                                    head_dim=64, page_size=8)
    k8, v8 = scaled_copy(k), scaled_copy(v * v_size)
    q = jnp.asarray(rng.standard_normal((3, 8, 64)) * q_size, jnp.bfloat16)
    scale = 0.125 / q_size  # the same softmax at every query size
    out = kernel.paged_decode_attention(q, k8, v8, table, lens, scale=scale,
                                        tuning=small_tuning(table), interpret=True)
    want = reference.paged_decode_attention(q.astype(jnp.float32), widen(k8), widen(v8),
                                            table, lens, scale=scale)
    assert relative_error(out.astype(jnp.float32), want) < max(5e-3, ERROR_BOUND[widening])


E4M3 = "float8_e4m3fn"


@pytest.mark.parametrize("kv_dtype,widening,operands", [
    (jnp.float8_e4m3fn, "bfloat16", ["bfloat16"] * 2),
    (jnp.float8_e4m3fn, "float16", ["float16"] * 2),
    (jnp.float8_e4m3fn, "e4m3", [E4M3] * 2),
    (jnp.float8_e4m3fn, "e4m3x2", [E4M3] * 4),  # two terms of ours a dot
    (jnp.float8_e4m3fn, "e4m3qk", [E4M3] * 2 + ["float16"]),
    (jnp.int8, "float16", ["bfloat16"] * 2),  # the switch is for e4m3 codes only
    (jnp.int8, "e4m3", ["bfloat16"] * 2)])
def test_the_switch_sets_what_both_dots_multiply(kv_dtype, widening, operands, monkeypatch):
    monkeypatch.setattr(kernel, "FP8_WIDEN", widening)
    rng = np.random.default_rng(6)
    k, v, table, lens = paged_setup(rng, batch=2, lengths=[20, 9], num_kv_heads=2,
                                    head_dim=64, page_size=8)
    k8, v8 = scaled_copy(k, kv_dtype), scaled_copy(v, kv_dtype)
    q = jnp.zeros((2, 8, 64), jnp.bfloat16)
    dots = kernel_equations(
        lambda *a: kernel.paged_decode_attention(*a, scale=0.1, interpret=True),
        q, k8, v8, table, lens, primitive="dot_general")
    assert dots == [((dtype, dtype), ("float32",)) for dtype in operands]


def test_an_unknown_widening_is_refused(monkeypatch):
    monkeypatch.setattr(kernel, "FP8_WIDEN", "float8")
    rng, k8, v8, _, _, table, lens = fp8_setup(7, [9])
    with pytest.raises(ValueError, match="FP8_WIDEN"):
        kernel.paged_decode_attention(jnp.zeros((1, 8, 64)), k8, v8, table, lens, scale=0.1,
                                      interpret=True)


@pytest.mark.parametrize("widening", WIDENINGS)
def test_decode_kernel_on_fp8_pages_lowers_for_cuda(widening, monkeypatch):
    monkeypatch.setattr(kernel, "FP8_WIDEN", widening)
    rng = np.random.default_rng(3)
    k, v, table, lens = paged_setup(rng, batch=3, lengths=[300, 5, 77], num_kv_heads=8,
                                    head_dim=128, page_size=16)
    k8, v8 = scaled_copy(k), scaled_copy(v)
    q = jnp.zeros((3, 32, 128), jnp.bfloat16)
    text = lowers_for_cuda(lambda *a: kernel.paged_decode_attention(*a, scale=0.1),
                           q, k8, v8, table, lens)
    assert "ninfer_paged_decode" in text


@needs_gpu
@pytest.mark.parametrize("widening", WIDENINGS)
@pytest.mark.parametrize("lengths", [[1, 1000, 4097, 333], [384] * 64])
def test_decode_kernel_on_gpu_reads_fp8_pages(lengths, widening, monkeypatch):
    monkeypatch.setattr(kernel, "FP8_WIDEN", widening)
    rng = np.random.default_rng(len(lengths))
    k, v, table, lens = paged_setup(rng, batch=len(lengths), lengths=lengths, num_kv_heads=8,
                                    head_dim=128, page_size=16)
    k8, v8 = scaled_copy(k), scaled_copy(v)
    q = jnp.asarray(rng.standard_normal((len(lengths), 32, 128)), jnp.bfloat16)
    out = kernel.paged_decode_attention(q, k8, v8, table, lens, scale=128 ** -0.5)
    want = reference.paged_decode_attention(q, widen(k8), widen(v8), table, lens,
                                            scale=128 ** -0.5)
    assert relative_error(out, want) < max(2e-2, ERROR_BOUND[widening])
