"""Quantized weights: host formats (quantize / dequantize round trips, packing layout), the jnp
reference, and the Pallas decode matmul vs the reference (interpret mode on CPU, native on GPU)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from ninfer_jax.kernels import quant_matmul
from ninfer_jax.kernels.quant_matmul import formats, gemv, kernel, reference
from ninfer_jax.kernels.quant_matmul.tuning import MatmulTuning, matmul_tuning
from kernel_testkit import (cpu_only, kernel_equations, lowers_for_cuda, needs_gpu,
                            relative_error)

# Relative Frobenius error of quantizing N(0, 1) weights; each format's bound is loose enough
# for any seed and tight enough to catch a wrong scale or a swapped nibble.
# the formats of this file's kernels; GGUF block formats have their own (test_ggml_matmul.py)
COLUMN_FORMATS = tuple(f for f in formats.QUANTIZED_FORMATS if f not in formats.BLOCK_FORMATS)
ROUND_TRIP_BOUND = {"int8": 0.012, "fp8": 0.04, "int4": 0.15, "nvfp4": 0.13}


def gaussian(rows, cols, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


@pytest.mark.parametrize("fmt", COLUMN_FORMATS)
def test_round_trip_error_is_within_the_formats_bound(fmt):
    w = gaussian(300, 64)  # 300 rows: not a multiple of either group size
    leaf = formats.quantize(w, fmt)
    back = formats.dequantize_numpy(leaf)
    assert back.shape[0] >= 300 and not back[300:].any(), "group padding rows must be zero"
    assert relative_error(back[:300], w) < ROUND_TRIP_BOUND[fmt]
    assert formats.format_of(leaf) == fmt


def test_exactly_representable_int4_weights_round_trip_exactly():
    rng = np.random.default_rng(3)
    scale = rng.uniform(0.5, 2.0, (2, 8)).astype(np.float16).astype(np.float32)
    q = rng.integers(-7, 8, (256, 8))
    q[0], q[128] = 7, -7  # each group's absmax is 7 steps, so the scale is recovered exactly
    w = q * np.repeat(scale, 128, axis=0)
    np.testing.assert_array_equal(formats.dequantize_numpy(formats.quantize(w, "int4")), w)


def test_nibbles_pack_neighbouring_columns_low_first():
    codes = np.array([[1, 2, 3, 4], [15, 0, 7, 8]], np.uint8)
    packed = formats.pack_nibbles(codes)
    np.testing.assert_array_equal(packed, [[0x21, 0x43], [0x0F, 0x87]])
    np.testing.assert_array_equal(formats.unpack_nibbles(packed), codes)
    np.testing.assert_array_equal(np.asarray(reference.unpack_nibbles(jnp.asarray(packed))), codes)


def test_e2m1_decoding_covers_all_sixteen_codes():
    codes = np.arange(16, dtype=np.uint8)
    expected = np.concatenate([formats.E2M1_VALUES, -formats.E2M1_VALUES])
    np.testing.assert_array_equal(np.asarray(reference.e2m1_values(jnp.asarray(codes))), expected)


def test_nvfp4_scales_are_fp8_and_reach_the_top_of_their_range():
    leaf = formats.quantize(gaussian(64, 32, seed=4), "nvfp4")
    assert leaf["scale"].dtype == ml_dtypes.float8_e4m3fn and leaf["scale"].shape == (4, 32)
    assert float(leaf["scale"].astype(np.float32).max()) == formats.FP8_MAX


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="even"):
        formats.quantize(gaussian(16, 3), "int4")
    with pytest.raises(ValueError, match="unknown weight format"):
        formats.quantize(gaussian(16, 4), "int3")
    with pytest.raises(ValueError, match="not a quantized weight leaf"):
        formats.format_of({"scale": np.ones(3)})


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_reference_dequantize_matches_the_host_decoder(fmt):
    leaf = formats.quantize(gaussian(160, 32, seed=5), fmt)  # 160: K whole GGUF blocks
    device = jax.tree.map(jnp.asarray, leaf)
    np.testing.assert_allclose(np.asarray(reference.dequantize(device)),
                               formats.dequantize_numpy(leaf), rtol=1e-6, atol=1e-7)


def test_describe_reports_format_shape_and_bytes():
    leaf = formats.quantize(gaussian(256, 64), "int4")
    assert formats.describe(leaf) == "int4 [256, 64] 8448 bytes"  # 256*32 code bytes + 2*64 f16 scales


def quantized(fmt, k, n, seed=0):
    return jax.tree.map(jnp.asarray, formats.quantize(gaussian(k, n, seed) * 0.05, fmt))


# (format, rows, K, N, tuning): odd row counts, K not a multiple of 128 (int4 pads), several
# K splits and column blocks so the grid, the loop and the split sum all run.
KERNEL_GRID = [
    ("int8", 1, 96, 64, MatmulTuning(block_n=32, block_k=32, num_splits=3)),
    ("fp8", 5, 128, 96, MatmulTuning(block_n=32, block_k=32, num_splits=2)),
    ("int4", 3, 200, 64, MatmulTuning(block_n=32, block_k=128, num_splits=2)),
    ("nvfp4", 2, 112, 64, MatmulTuning(block_n=64, block_k=16, num_splits=7)),
    ("nvfp4", 17, 64, 32, None),
    # one row: the FMA kernel (gemv.py)
    ("int4", 1, 200, 64, MatmulTuning(block_n=32, block_k=128, num_splits=2, use_dot=False)),
    ("nvfp4", 1, 112, 64, MatmulTuning(block_n=32, block_k=16, num_splits=7, use_dot=False)),
    ("nvfp4", 1, 256, 64, MatmulTuning(block_n=64, block_k=64, num_splits=2, use_dot=False)),
    ("int8", 1, 64, 32, None),
    ("fp8", 1, 128, 96, MatmulTuning(block_n=32, block_k=32, num_splits=2, use_dot=False)),
]


@cpu_only
@pytest.mark.parametrize("fmt,rows,k,n,tuning", KERNEL_GRID)
def test_kernel_in_interpret_mode_matches_reference(fmt, rows, k, n, tuning):
    w = quantized(fmt, k, n, seed=rows)
    x = jnp.asarray(gaussian(rows, k, seed=7) * 30)  # large activations: checks the x scaling
    run = jax.jit(functools.partial(kernel.matmul, tuning=tuning, interpret=True))
    out = run(x, w)
    assert out.shape == (rows, n) and out.dtype == x.dtype
    assert relative_error(out, reference.matmul(x, w)) < 2e-3


ONE_ROW_FP8 = MatmulTuning(block_n=32, block_k=32, num_splits=2, use_dot=False)


@cpu_only
@pytest.mark.parametrize("widening", gemv.FP8_WIDEN_CHOICES)
@pytest.mark.parametrize("x_size", [30.0, 1e6, 1e-6])
def test_one_row_kernel_widens_fp8_either_way_at_any_activation_size(widening, x_size,
                                                                      monkeypatch):
    """gemv.FP8_WIDEN: float32 FMA, or float16 codes times float16 x. bf16 activations of 1e6
    (a float16 product overflows from 146 x 448) or 1e-6 (float16 subnormals): x's power-of-two
    scale keeps the float16 path as close to the reference as the kernel grid's bound."""
    monkeypatch.setattr(gemv, "FP8_WIDEN", widening)
    w = quantized("fp8", 128, 96, seed=1)
    x = jnp.asarray(gaussian(1, 128, seed=7) * x_size).astype(jnp.bfloat16)
    run = jax.jit(functools.partial(kernel.matmul, tuning=ONE_ROW_FP8, interpret=True,
                                    out_dtype=jnp.float32))
    assert relative_error(run(x, w), reference.matmul(x.astype(jnp.float32), w)) < 2e-3


@pytest.mark.parametrize("widening,fmt,products", [
    ("float32", "fp8", set()), ("float16", "fp8", {("float16", "float16")}),
    ("float16", "int8", set())])  # the switch is for fp8 codes only
def test_the_switch_sets_what_the_one_row_kernel_multiplies(widening, fmt, products,
                                                            monkeypatch):
    monkeypatch.setattr(gemv, "FP8_WIDEN", widening)
    w = quantized(fmt, 128, 96)
    x = jnp.zeros((1, 128), jnp.bfloat16)
    muls = kernel_equations(functools.partial(kernel.matmul, tuning=ONE_ROW_FP8, interpret=True),
                            x, w, primitive="mul")
    assert {ins for ins, _ in muls if "float16" in ins} == products


@cpu_only
def test_the_one_row_kernel_streams_plain_bf16_tiles_in_interpret_mode():
    """kernel_bench's gemvsweep times the one-row loop over bf16 tiles against int8 codes;
    the bf16 tiles must give the plain product (scale one) for that comparison to mean
    anything."""
    from ninfer_jax.kernels.quant_matmul import gemv
    k, n = 192, 96
    w = jnp.asarray(gaussian(k, n, seed=4) * 0.05).astype(jnp.bfloat16)
    x = jnp.asarray(gaussian(1, k, seed=5)).astype(jnp.bfloat16)
    tuning = MatmulTuning(block_n=32, block_k=32, num_splits=3, use_dot=False)
    out = jax.jit(functools.partial(gemv.gemv, fmt="bf16", n=n, tuning=tuning, interpret=True))(
        x[0], {"bf16": w, "scale": jnp.ones((n,), jnp.float32)})
    want = x.astype(jnp.float32)[0] @ w.astype(jnp.float32)
    assert out.shape == (n,) and relative_error(out, want) < 1e-5


def test_tuning_tiles_divide_the_weight_and_hold_whole_groups():
    for fmt, k, n in [("int4", 4096, 14336), ("nvfp4", 14336, 4096), ("int8", 576, 1536)]:
        for rows in (1, 8, 64):
            t = matmul_tuning(rows=rows, k=k, n=n, fmt=fmt)
            assert n % t.block_n == 0 and k % (t.block_k * t.num_splits) == 0
            assert t.block_k % {"int4": 128, "nvfp4": 16, "int8": 1}[fmt] == 0
            assert t.use_dot == (rows > 1)
            assert t.use_dot or t.block_k * t.block_n <= 8192
    assert matmul_tuning(rows=1, k=100, n=64, fmt="int8") is None  # no power-of-2 K tile


def test_dispatch_uses_xla_for_plain_weights_and_the_reference_on_cpu():
    x = jnp.asarray(gaussian(3, 64))
    w = gaussian(64, 32, seed=1)
    np.testing.assert_allclose(np.asarray(quant_matmul.matmul(x, jnp.asarray(w))),
                               np.asarray(x) @ w, rtol=1e-5, atol=1e-5)
    leaf = quantized("int8", 64, 32)
    out = quant_matmul.matmul(x, leaf, out_dtype=jnp.float32)
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference.matmul(x, leaf)), rtol=1e-6)


@pytest.mark.parametrize("fmt", COLUMN_FORMATS)
@pytest.mark.parametrize("rows", [1, 8])
def test_kernel_lowers_for_cuda(fmt, rows):
    _lowers(fmt, rows)


@pytest.mark.parametrize("widening", gemv.FP8_WIDEN_CHOICES)
def test_one_row_fp8_kernel_lowers_for_cuda_either_way(widening, monkeypatch):
    monkeypatch.setattr(gemv, "FP8_WIDEN", widening)
    _lowers("fp8", 1)


def _lowers(fmt, rows):
    w = quantized(fmt, 4096 if fmt == "int4" else 512, 256)
    x = jnp.zeros((rows, w[fmt].shape[0]), jnp.bfloat16)
    name = f"ninfer_{fmt}_gemv" if rows == 1 else f"ninfer_{fmt}_matmul"
    assert name in lowers_for_cuda(kernel.matmul, x, w)


@needs_gpu
@pytest.mark.parametrize("widening", gemv.FP8_WIDEN_CHOICES)
def test_one_row_fp8_kernel_on_gpu_matches_reference_either_way(widening, monkeypatch):
    monkeypatch.setattr(gemv, "FP8_WIDEN", widening)
    test_kernel_on_gpu_matches_reference("fp8", 1)


@needs_gpu
@pytest.mark.parametrize("fmt", COLUMN_FORMATS)
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_kernel_on_gpu_matches_reference(fmt, rows):
    w = quantized(fmt, 1024, 768, seed=rows)
    x = jnp.asarray(gaussian(rows, 1024, seed=8), jnp.bfloat16)
    out = jax.jit(kernel.matmul)(x, w)
    ref = jax.jit(reference.matmul)(x.astype(jnp.float32), w)
    assert relative_error(out, ref) < 1e-2


def test_one_row_kernel_decoders_are_exact_for_every_code():
    """The bit tricks in gemv.py against plain conversions, code by code."""
    from ninfer_jax.kernels.quant_matmul import gemv
    nibbles = jnp.arange(16, dtype=jnp.uint8)
    np.testing.assert_array_equal(np.asarray(gemv._nibble_values("int4", nibbles)),
                                  np.arange(16) - formats.INT4_OFFSET)
    np.testing.assert_array_equal(
        np.asarray(gemv._nibble_values("nvfp4", nibbles)) * gemv.NVFP4_EXPONENT_GAP,
        np.concatenate([formats.E2M1_VALUES, -formats.E2M1_VALUES]))
    every_int8 = jnp.arange(-128, 128, dtype=jnp.int32).astype(jnp.int8)
    np.testing.assert_array_equal(np.asarray(gemv._byte_values("int8", every_int8)),
                                  np.arange(-128, 128))
