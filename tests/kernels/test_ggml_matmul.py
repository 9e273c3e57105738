"""The CPU block kernel (kernels/quant_matmul/cpu) against the jnp reference, over GGUF block
formats, shapes (one row to past the tile, K from one block up, N odd and large) and every SIMD
path this CPU has. The oracle (reference.block_matmul) does the kernel's arithmetic in jnp
(llama.cpp's q8 activation blocks with f16 scales), so the two differ only in summation order;
a wrong nibble order, scale, rounding or offset is off by far more.
Without the built extension these tests skip, or fail when CI is set (CI must build it)."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.kernels import quant_matmul
from ninfer_jax.kernels.quant_matmul import cpu, formats, reference

pytestmark = pytest.mark.skipif(
    not cpu.available() and not os.environ.get("CI"),
    reason="CPU block kernel not built (pip install -e . builds it)")

# row tiles of 1-4 and their remainders, column tiles of 4 / 2 with 1-column tails, bands of 48
SHAPES = [(1, 32, 1), (1, 576, 1536), (2, 64, 6), (3, 64, 7), (4, 96, 50), (5, 1536, 576),
          (6, 32, 3), (8, 96, 33), (17, 160, 65)]


def test_the_extension_is_built():
    assert cpu.available(), "the CPU block kernel must be built (setup.py) where CI is set"
    assert cpu.path_name() in cpu.available_paths()


def _case(fmt, K, N, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((K, N)).astype(np.float32)
    w[:, :1] *= 40.0  # one loud column: scales differ a lot between blocks
    return formats.quantize(w, fmt)


@pytest.mark.parametrize("fmt", formats.BLOCK_FORMATS)
def test_kernel_matches_the_reference_on_every_path(fmt):
    paths = cpu.available_paths()
    for index, (M, K, N) in enumerate(SHAPES):
        leaf = _case(fmt, K, N, index)
        x = np.random.default_rng(100 + index).standard_normal((M, K)).astype(np.float32)
        x[0, :32] = 0.0  # an all-zero activation block (scale 0)
        want = np.asarray(reference.block_matmul(jnp.asarray(x), jnp.asarray(leaf[fmt]), fmt))
        for path in paths:
            got = np.asarray(jax.jit(lambda x, b, p=path: cpu.matmul(x, {fmt: b}, path=p))(
                x, leaf[fmt]))
            scale = np.abs(want).max() + 1e-6
            assert np.abs(got - want).max() / scale < 2e-5, (fmt, M, K, N, path)


@pytest.mark.parametrize("fmt", formats.BLOCK_FORMATS)
def test_reference_dequantizes_as_gguf_does(fmt):
    leaf = _case(fmt, 96, 10, 7)
    got = np.asarray(reference.dequantize({fmt: jnp.asarray(leaf[fmt])}))
    np.testing.assert_array_equal(got, formats.dequantize_numpy(leaf))
    assert formats.logical_shape(leaf) == (96, 10)


def test_matmul_dispatch_uses_the_kernel_for_decode_rows_and_xla_for_chunks(monkeypatch):
    leaf = {"q4_1": jnp.asarray(_case("q4_1", 64, 16, 3)["q4_1"])}
    small = jnp.asarray(np.random.default_rng(4).standard_normal((2, 64)), jnp.float32)
    large = jnp.ones((quant_matmul.CPU_KERNEL_MAX_ROWS + 1, 64), jnp.float32)
    small_text = jax.jit(quant_matmul.matmul).lower(small, leaf).as_text()
    assert cpu.TARGET in small_text
    assert cpu.TARGET not in jax.jit(quant_matmul.matmul).lower(large, leaf).as_text()
    # both routes compute the same product up to the activations' rounding
    exact = np.asarray(reference.matmul(small, leaf))
    np.testing.assert_allclose(np.asarray(quant_matmul.matmul(small, leaf)), exact,
                               rtol=0.02, atol=0.02 * np.abs(exact).max())
    monkeypatch.setenv("NINFER_FORCE_REFERENCE", "1")
    forced = jax.jit(lambda x, w: quant_matmul.matmul(x, w))  # a fresh trace reads the env
    assert cpu.TARGET not in forced.lower(small, leaf).as_text()


@pytest.mark.parametrize("path", cpu.available_paths())
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(path):
    # No row's product depends on the others (row tiles, column split over threads), so
    # decode rows batched with verify rows or other lanes get the bits they get alone.
    leaf = {"q4_1": jnp.asarray(_case("q4_1", 576, 1536, 5)["q4_1"])}
    x = jnp.asarray(np.random.default_rng(6).standard_normal((67, 576)), jnp.float32)
    batch = np.asarray(cpu.matmul(x, leaf, path=path))
    for row in (0, 5, 66):
        alone = np.asarray(cpu.matmul(x[row:row + 1], leaf, path=path))
        np.testing.assert_array_equal(alone[0], batch[row])
    np.testing.assert_array_equal(np.asarray(cpu.matmul(x[3:11], leaf, path=path)), batch[3:11])


def test_kernel_refuses_a_k_that_does_not_match_the_blocks():
    leaf = _case("q8_0", 64, 4, 1)
    with pytest.raises(Exception, match="blocks"):
        jax.block_until_ready(cpu.matmul(jnp.ones((1, 96), jnp.float32), {"q8_0": leaf["q8_0"]}))


@pytest.mark.parametrize("fmt", formats.BLOCK_FORMATS)
def test_activation_rounding_is_llamacpps(fmt):
    # Exact halves (max|x| = 127, so x * 127 / max|x| = x) round to even, and tiny blocks get a
    # subnormal f16 scale: both must match the oracle's llama.cpp rounding, not just be close.
    leaf = _case(fmt, 96, 9, 11)
    x = np.zeros((2, 96), np.float32)
    x[0, :32] = np.arange(32) - 15.5
    x[0, 31] = 127.0
    x[0, 32:64] = np.random.default_rng(12).standard_normal(32) * 1e-4  # d below f16's normals
    x[1] = np.random.default_rng(13).standard_normal(96) * 3.0
    want = np.asarray(reference.block_matmul(jnp.asarray(x), jnp.asarray(leaf[fmt]), fmt))
    for path in cpu.available_paths():
        got = np.asarray(cpu.matmul(jnp.asarray(x), {fmt: jnp.asarray(leaf[fmt])}, path=path))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    codes, d, _ = reference.quantize_activations(jnp.asarray(x[:1, :32]))
    assert np.asarray(codes)[0, 0, :4].tolist() == [-16.0, -14.0, -14.0, -12.0]


def _activation_rounding_bound(x, leaf, fmt):
    """Per output, the most the kernel may differ from x @ dequantize(w) because it rounds x to
    llama.cpp's 8-bit blocks (from the arithmetic, not fitted): per block of 32 with scale
    c = max|x| / 127, a code's x - c * q is at most c / 2; the f16 rounding of c moves each of
    the <= 127 steps by at most e = c * 2^-11 + 2^-25 (half an f16 ulp, relative or, below
    f16's normals, absolute); q4_1's offset uses s = f16(c * sum q) instead of d * sum q, off by
    at most |c sum q| 2^-11 + 2^-25 + e |sum q|, times |m|. f32 sums of both sides: 1e-5 of
    sum |x| |w| (~nb * 2^-24 is their worst)."""
    w = formats.dequantize_numpy(leaf)  # [K, N]
    K, N = w.shape
    xb = x.reshape(x.shape[0], -1, 32).astype(np.float64)
    amax = np.abs(xb).max(-1)
    c = amax / 127.0
    codes = np.round(xb * np.where(amax > 0, 127.0 / np.where(amax > 0, amax, 1), 0)[..., None])
    e = c * 2.0**-11 + 2.0**-25
    per_value = c / 2 + 127 * e  # [M, nb]
    wb = np.abs(w.astype(np.float64)).reshape(-1, 32, N).sum(1)  # [nb, N]
    bound = per_value @ wb
    if fmt == "q4_1":
        m = np.asarray(leaf[fmt]).reshape(N, -1, 20)[..., 2:4].copy().view(np.float16)[..., 0]
        sums = np.abs(codes.sum(-1))
        bound += (c * sums * 2.0**-11 + 2.0**-25 + e * sums) @ np.abs(m.T.astype(np.float64))
    return bound + 1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)))


@pytest.mark.parametrize("fmt", formats.BLOCK_FORMATS)
def test_kernel_is_the_dequantized_product_up_to_activation_rounding(fmt):
    # The jnp dequantize reference (what prefill chunks and NINFER_FORCE_REFERENCE run) is the
    # exact product; the kernel may differ from it only by rounding x to 8 bits per block.
    # The grid covers every row tile (1-4) and remainder up to CPU_KERNEL_MAX_ROWS, column
    # tails and bands, one block to K = 1536, and activation blocks of very different scales.
    rng = np.random.default_rng(21)
    for K, N in ((32, 3), (96, 9), (576, 130), (1536, 21)):
        leaf = _case(fmt, K, N, K + N)
        for M in (1, 2, 3, 4, 5, 7, 9, quant_matmul.CPU_KERNEL_MAX_ROWS):
            x = rng.standard_normal((M, K)).astype(np.float32)
            x *= np.exp(rng.uniform(-6, 3, (M, K // 32, 1))).repeat(32, 1).reshape(M, K)
            got = np.asarray(cpu.matmul(jnp.asarray(x), {fmt: jnp.asarray(leaf[fmt])}),
                             np.float64)
            want = np.asarray(reference.matmul(jnp.asarray(x), {fmt: jnp.asarray(leaf[fmt])}),
                              np.float64)
            error, bound = np.abs(got - want), _activation_rounding_bound(x, leaf, fmt)
            assert (error <= bound).all(), (fmt, M, K, N, (error / bound).max())
            # and the rounding is not nothing: the bound is a worst case, not a slack
            assert error.max() > 1e-3 * bound.max(), (fmt, M, K, N)


# ------------------------------------------------------------------ the interleaved layout
needs_interleaved = pytest.mark.skipif(not cpu.interleaved_simd(),
                                       reason="no SIMD path for the interleaved layout here")


@pytest.mark.parametrize("fmt", formats.BLOCK_FORMATS)
def test_interleaving_keeps_every_weight_and_table_row(fmt):
    leaf = _case(fmt, 96, 48, 31)
    name = f"{fmt}x{formats.INTERLEAVE}"
    interleaved = {name: formats.interleave_blocks(leaf[fmt], fmt)}
    assert interleaved[name].shape == (3, 16 * 3 * formats.BLOCK_BYTES[fmt])
    assert formats.logical_shape(interleaved) == (96, 48)
    assert formats.stored_bytes(interleaved) == formats.stored_bytes(leaf)
    want = formats.dequantize_numpy(leaf)
    np.testing.assert_array_equal(formats.dequantize_numpy(interleaved), want)
    np.testing.assert_array_equal(
        np.asarray(reference.dequantize({name: jnp.asarray(interleaved[name])})), want)
    # a tied table's lookup reads its rows out of the groups
    tokens = jnp.asarray([[0, 17, 47], [33, 16, 15]])
    raw, base = reference.block_rows(jnp.asarray(interleaved[name]), name, tokens)
    assert base == fmt
    np.testing.assert_array_equal(np.asarray(raw), np.asarray(leaf[fmt])[np.asarray(tokens)])


@needs_interleaved
@pytest.mark.parametrize("fmt", formats.BLOCK_FORMATS)
def test_interleaved_kernel_matches_the_reference_with_the_same_bits_on_every_path(fmt):
    # Every path does the same integer dots and the same f32 FMAs per column, so their bits
    # agree; against the oracle only the summation order differs. Row tiles of 1-8 (AVX-512)
    # and 1-4 (AVX2) with remainders, one block to K = 1536, one group to many.
    for index, (M, K, N) in enumerate([(1, 32, 16), (2, 64, 32), (5, 576, 192), (8, 96, 48),
                                       (11, 1536, 64), (67, 160, 16)]):
        leaf = _case(fmt, K, N, 50 + index)
        x = np.random.default_rng(60 + index).standard_normal((M, K)).astype(np.float32)
        x[0, :32] = 0.0
        want = np.asarray(reference.block_matmul(jnp.asarray(x), jnp.asarray(leaf[fmt]), fmt))
        interleaved = cpu.interleave({fmt: jnp.asarray(leaf[fmt])})
        assert list(interleaved) == [f"{fmt}x16"]
        outs = {path: np.asarray(cpu.matmul(jnp.asarray(x), interleaved, path=path))
                for path in cpu.available_paths()}
        for path, got in outs.items():
            scale = np.abs(want).max() + 1e-6
            assert np.abs(got - want).max() / scale < 2e-5, (fmt, M, K, N, path)
            np.testing.assert_array_equal(got, outs["scalar"], err_msg=f"{fmt} {M} {path}")


@needs_interleaved
def test_interleaved_rows_get_the_same_bits_alone_and_in_any_batch():
    leaf = cpu.interleave({"q4_1": jnp.asarray(_case("q4_1", 576, 1536, 5)["q4_1"])})
    x = jnp.asarray(np.random.default_rng(6).standard_normal((67, 576)), jnp.float32)
    batch = np.asarray(cpu.matmul(x, leaf))
    for row in (0, 9, 66):
        np.testing.assert_array_equal(np.asarray(cpu.matmul(x[row:row + 1], leaf))[0],
                                      batch[row])
    np.testing.assert_array_equal(np.asarray(cpu.matmul(x[3:14], leaf)), batch[3:14])


@needs_interleaved
def test_load_interleaves_block_leaves_and_prefill_chunks_use_the_kernel():
    from ninfer_jax.model import steps
    params = {"embed": {"q8_0": _case("q8_0", 64, 32, 1)["q8_0"]},
              "layers": [{"wq": {"q4_1": _case("q4_1", 64, 48, 2)["q4_1"]},
                          "wo": {"q4_0": _case("q4_0", 64, 40, 3)["q4_0"]}}]}  # 40: kept
    loaded = steps.expand_quantized(params, jnp.float32)
    assert list(loaded["embed"]) == ["q8_0x16"] and list(loaded["layers"][0]["wq"]) == ["q4_1x16"]
    assert list(loaded["layers"][0]["wo"]) == ["q4_0"]
    chunk = jnp.ones((quant_matmul.CPU_KERNEL_MAX_ROWS * 4, 64), jnp.float32)
    assert cpu.TARGET in jax.jit(quant_matmul.matmul).lower(
        chunk, loaded["layers"][0]["wq"]).as_text()
    np.testing.assert_allclose(
        np.asarray(quant_matmul.matmul(chunk, loaded["layers"][0]["wq"])),
        np.asarray(reference.matmul(chunk, {"q4_1": jnp.asarray(params["layers"][0]["wq"]["q4_1"])})),
        rtol=0.02, atol=0.02)
