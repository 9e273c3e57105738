"""4-bit KV pages (`--kv-dtype k8v4`: int8 keys and int4 values; `nvfp4`: E2M1 keys and values;
FourBitPages: two codes per byte, an e4m3 scale per 16 elements, a float32 scale per token and
kv head): what write_kv stores against a numpy twin of the format, the references and the
Pallas decode kernel (interpret mode, its CUDA lowering, natively on a GPU) attending over
exactly those values, and their error against f32 pages."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from ninfer_jax.kernels import paged_attention
from ninfer_jax.kernels.paged_attention import kernel, prefill, reference
from ninfer_jax.kernels.paged_attention.reference import (
    K8V4, NVFP4, E2M1Pages, Int4Pages, ScaledPages, cache_specs, widen)
from ninfer_jax.kernels.ragged_attention import kernel as ragged_kernel
from ninfer_jax.kernels.paged_attention.tuning import DecodeTuning
from ninfer_jax.kernels.ragged_attention import reference as ragged_reference
from kernel_testkit import cpu_only, lowers_for_cuda, needs_gpu, paged_setup, relative_error

FORMATS = {"k8v4": K8V4, "nvfp4": NVFP4}


def numpy_four_bit(values, kind):
    """The format written out in numpy: values [..., D] -> what its pages read back [..., D].
    E2M1 rounds through ml_dtypes' float4_e2m1fn (nearest, ties to even, saturating), int4 by
    np.round clipped to +-7; scales as the format defines them."""
    level_max = 6.0 if kind is E2M1Pages else 7.0
    blocks = values.astype(np.float32).reshape(*values.shape[:-1], -1, 16)
    block_max = np.abs(blocks).max(axis=-1)
    scale = block_max.max(axis=-1) / np.float32(level_max * 448.0)
    safe = np.where(scale > 0, scale, np.float32(1))[..., None]
    block_scale = (block_max / np.float32(level_max) / safe).astype(ml_dtypes.float8_e4m3fn)
    step = block_scale.astype(np.float32) * scale[..., None]
    x = blocks / np.where(step > 0, step, np.float32(1))[..., None]
    if kind is E2M1Pages:
        levels = x.astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    else:
        levels = np.clip(np.round(x), -7, 7)
    return (levels * block_scale.astype(np.float32)[..., None]).reshape(values.shape) \
        * scale[..., None]


def written(cache, fmt):
    """The f32 caches [P, K, S, D] (k, v) written token by token into `fmt` pages."""
    k, v = cache
    P, K, S, D = k.shape
    empty = [jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype), spec)
             for spec in cache_specs(P, S, K, D, fmt)]
    tokens = [jnp.moveaxis(c, 2, 1).reshape(P * S, K, D) for c in (k, v)]
    return jax.jit(reference.write_kv)(*empty, *tokens, jnp.arange(P * S))


@pytest.mark.parametrize("kind", [E2M1Pages, Int4Pages])
def test_write_kv_stores_the_numpy_format_within_its_error_bound(kind):
    """Tokens of very different sizes (1e4, 1, 1e-4, 0): the pages read back the numpy
    twin's values, every element within half the format's widest level gap of its block's
    step (E2M1: 4 -> 6, so 1 step; int4: 0.5 step; a step is block absmax / level max, the
    e4m3 block scale adding 2^-4), nothing overflows, a zero token reads zeros, the codes
    are packed two per byte, and the dummy page is not written."""
    rng = np.random.default_rng(0)
    magnitudes = np.array([1e4, 1.0, 1e-4, 0.0], np.float32)
    values = rng.standard_normal((4, 2, 32)).astype(np.float32) * magnitudes[:, None, None]
    spec = (E2M1Pages if kind is E2M1Pages else K8V4.value)
    fmt = NVFP4 if kind is E2M1Pages else K8V4
    k_cache, v_cache = [jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), s)
                        for s in cache_specs(3, 2, 2, 32, fmt)]
    assert spec is kind and isinstance(v_cache, kind)
    assert v_cache.codes.shape == (3, 2, 2, 16) and v_cache.codes.dtype == jnp.uint8
    assert v_cache.block_scale.shape == (3, 2, 2, 2) and v_cache.scale.shape == (3, 2, 2)
    slots = jnp.array([2, 3, 4, 5])  # pages 1 and 2
    _, v_cache = reference.write_kv(k_cache, v_cache, jnp.asarray(values), jnp.asarray(values),
                                    slots)
    stored = np.asarray(widen(v_cache))[[1, 1, 2, 2], :, [0, 1, 0, 1]]  # [4, K, D]
    np.testing.assert_allclose(stored, numpy_four_bit(values, kind), rtol=1e-6, atol=0)
    assert np.isfinite(stored).all() and (stored[3] == 0).all()
    block_max = np.abs(values.reshape(4, 2, 2, 16)).max(axis=-1, keepdims=True)
    gap = 1.0 if kind is E2M1Pages else 0.5
    bound = block_max * gap / (6.0 if kind is E2M1Pages else 7.0) * (1 + 2.0 ** -4)
    assert (np.abs(stored - values).reshape(4, 2, 2, 16) <= bound * (1 + 1e-6)).all()
    assert (np.asarray(widen(v_cache))[0] == 0).all()
    # each byte holds elements 2i (low nibble) and 2i + 1 (high)
    codes = np.asarray(v_cache.codes)[1, 0, 0]
    lows = np.asarray(widen(v_cache))[1, 0, 0, 0::2]
    assert ((codes & 15) == 0).tolist() == (lows == 0).tolist()


def setup(seed, lengths, fmt, *, kv_heads=2, head_dim=32, page_size=8):
    rng = np.random.default_rng(seed)
    k, v, table, lens = paged_setup(rng, batch=len(lengths), lengths=lengths,
                                    num_kv_heads=kv_heads, head_dim=head_dim,
                                    page_size=page_size)
    k4, v4 = written((k, v), fmt)
    return rng, (k, v), (k4, v4), (widen(k4), widen(v4)), table, lens


@pytest.mark.parametrize("name", FORMATS)
def test_references_attend_over_the_stored_values_within_a_bound_of_f32(name):
    """Decode and prefill (reference and the two-part XLA prefill) over 4-bit pages equal the
    same reference over f32 pages holding the widened values, and stay within a bound of the
    original f32 pages (int8 keys and int4 values, or E2M1 for both)."""
    fmt = FORMATS[name]
    rng, f32, packed, wide, table, lens = setup(1, [37, 5, 20], fmt)
    assert isinstance(packed[0], ScaledPages if fmt is K8V4 else E2M1Pages)
    q = jnp.asarray(rng.standard_normal((3, 8, 32)) * 2, jnp.float32)
    bound = {"k8v4": 0.12, "nvfp4": 0.25}[name]  # measured ~0.085 and 0.15-0.2 (3 seeds)
    decode = jax.jit(functools.partial(reference.paged_decode_attention, scale=0.25))
    with jax.default_matmul_precision("float32"):
        out = decode(q, *packed, table, lens)
        assert relative_error(out, decode(q, *wide, table, lens)) < 1e-5
        assert relative_error(out, decode(q, *f32, table, lens)) < bound
        chunk = jnp.asarray(rng.standard_normal((12, 8, 32)) * 2, jnp.float32)
        for run in (reference.paged_prefill_attention,
                    functools.partial(prefill.paged_prefill_attention, implementation="xla")):
            run = jax.jit(functools.partial(run, scale=0.25))
            out = run(chunk, *packed, table[0], jnp.int32(25))
            assert relative_error(out, run(chunk, *wide, table[0], jnp.int32(25))) < 1e-5
            assert relative_error(out, run(chunk, *f32, table[0], jnp.int32(25))) < bound


@cpu_only
@pytest.mark.parametrize("name,merge_min_splits", [("k8v4", 1), ("nvfp4", 10**6)])
def test_decode_kernel_in_interpret_mode_reads_four_bit_pages(name, merge_min_splits,
                                                               monkeypatch):
    """The Pallas decode kernel (interpret mode; the merge kernel and the XLA merge) over
    4-bit pages equals the reference over the widened values; a plain / quantized mix is
    refused there and runs the reference through the dispatch."""
    monkeypatch.setattr(kernel, "MERGE_KERNEL_MIN_SPLITS", merge_min_splits)
    rng, _, packed, wide, table, lens = setup(2, [29, 3, 16], FORMATS[name])
    q = jnp.asarray(rng.standard_normal((3, 8, 32)), jnp.float32)
    tuning = DecodeTuning(pages_per_block=2, pages_per_split=4,
                          num_splits=-(-table.shape[1] // 4))
    out = kernel.paged_decode_attention(q, *packed, table, lens, scale=0.25, tuning=tuning,
                                        interpret=True)
    want = reference.paged_decode_attention(q, *wide, table, lens, scale=0.25)
    assert relative_error(out, want) < 1e-5
    assert kernel.supports(*packed) and not kernel.supports(wide[0], packed[1])
    with pytest.raises(ValueError, match="does not read"):
        kernel.paged_decode_attention(q, wide[0], packed[1], table, lens, scale=0.25)
    monkeypatch.setattr(paged_attention, "use_kernels", lambda: True)
    mixed = paged_attention.paged_decode_attention(q, wide[0], packed[1], table, lens,
                                                   scale=0.25)
    assert relative_error(mixed, want) < 1e-5


@cpu_only
def test_ragged_kernel_rows_and_chunk_read_four_bit_pages():
    """The GPU ragged composition (interpret-mode decode rows, the two-part prefill through
    XLA) over k8v4 pages equals the ragged reference over the widened values."""
    rng, _, packed, wide, table, lens = setup(3, [29, 3], K8V4)
    q = jnp.asarray(rng.standard_normal((6, 8, 32)), jnp.float32)  # 4 chunk tokens + 2 rows
    args = dict(chunk_table=table[0], chunk_start=jnp.int32(20), row_tables=table,
                row_lengths=lens)
    static = dict(scale=0.25, num_chunk_tokens=4)
    out = jax.jit(functools.partial(ragged_kernel.ragged_paged_attention, interpret=True,
                                    prefill_implementation="xla", **static))(q, *packed, **args)
    want = jax.jit(functools.partial(ragged_reference.ragged_paged_attention, **static))(
        q, *wide, **args)
    assert relative_error(out, want) < 1e-5


def cuda_pages(fmt, lengths, seed):
    rng = np.random.default_rng(seed)
    k, v, table, lens = paged_setup(rng, batch=len(lengths), lengths=lengths, num_kv_heads=8,
                                    head_dim=128, page_size=16)
    return rng, written((k, v), fmt), table, lens


@pytest.mark.parametrize("name", FORMATS)
def test_decode_kernel_on_four_bit_pages_lowers_for_cuda(name):
    _, packed, table, lens = cuda_pages(FORMATS[name], [300, 5, 77], 3)
    q = jnp.zeros((3, 32, 128), jnp.bfloat16)
    text = lowers_for_cuda(lambda *a: kernel.paged_decode_attention(*a, scale=0.1),
                           q, *packed, table, lens)
    assert "ninfer_paged_decode" in text


@needs_gpu
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("lengths", [[1, 1000, 4097, 333], [384] * 64])
def test_decode_kernel_on_gpu_reads_four_bit_pages(name, lengths):
    rng, packed, table, lens = cuda_pages(FORMATS[name], lengths, len(lengths))
    q = jnp.asarray(rng.standard_normal((len(lengths), 32, 128)), jnp.bfloat16)
    out = kernel.paged_decode_attention(q, *packed, table, lens, scale=128 ** -0.5)
    want = reference.paged_decode_attention(q, *(widen(c) for c in packed), table, lens,
                                            scale=128 ** -0.5)
    assert relative_error(out, want) < 2e-2


def test_four_bit_pages_need_head_dims_in_blocks_of_16():
    with pytest.raises(ValueError, match="multiple of 16"):
        cache_specs(2, 4, 2, 8, NVFP4)
    with pytest.raises(ValueError, match="multiple of 16"):
        cache_specs(2, 4, 2, 24, K8V4)


def test_kv_dtype_names_the_formats(monkeypatch):
    """`--kv-dtype k8v4|nvfp4` give the KVFormats (their names are what the start-up log
    shows), with the GPU kernels too (they read the pages)."""
    from ninfer_jax.engine import runner

    assert runner.kv_dtype_for("k8v4") is K8V4 and runner.kv_dtype_for("nvfp4") is NVFP4
    assert (K8V4.name, NVFP4.name) == ("k8v4", "nvfp4")
    monkeypatch.setattr(runner, "use_kernels", lambda: True)
    assert runner.kv_dtype_for("nvfp4") is NVFP4
