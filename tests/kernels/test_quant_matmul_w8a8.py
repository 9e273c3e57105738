"""W8A8 (kernels/quant_matmul/w8a8.py): per-row activation quantization, the 8-bit GEMM against
its reference twin and against the weight-only reference within the activation-quantization
error, the load-time [N, K] leaves, and the NINFER_W8A8 switch in the dispatch. The bounds
marked cpu_only hold for XLA CPU's f32 arithmetic (and its kernel-less dispatch); on a GPU
the products run natively against the twin (Hopper's fp8 GEMMs may accumulate in fewer bits)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.kernels import quant_matmul
from ninfer_jax.kernels.dispatch import FORCE_REFERENCE_ENV
from ninfer_jax.kernels.quant_matmul import formats, reference, w8a8
from kernel_testkit import cpu_only, lowers_for_cuda, needs_gpu, relative_error

FORMATS = ("int8", "fp8")
ROW_COUNTS = (1, 2, 7, 64, 300)
K, N = 256, 96
EPS32 = 2.0 ** -24  # f32 unit roundoff


def weight(fmt, k=K, n=N, seed=0):
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32) * 0.05
    return jax.tree.map(jnp.asarray, formats.quantize(w, fmt))


def activations(rows, k=K, seed=1):
    """Gaussian rows; row 1 all zeros, row 2 with one outlier 500x the rest, row rows//2 zero."""
    x = np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32)
    if rows >= 2:
        x[1] = 0.0
    if rows >= 3:
        x[2, 5] = 500.0
    if rows >= 8:
        x[rows // 2] = 0.0
    return jnp.asarray(x)


def both_layouts(fmt):
    leaf = weight(fmt)
    return [leaf, w8a8.transposed(leaf)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_row_quantization_scales_zero_rows_and_range(fmt):
    x = activations(7)
    codes, scale = reference.quantize_rows(x, fmt)
    top = reference.ACTIVATION_MAX[fmt]
    assert codes.dtype == reference.ACTIVATION_DTYPE[fmt] and scale.shape == (7,)
    values = np.asarray(codes.astype(jnp.float32))
    assert np.all(np.isfinite(values)) and np.all(np.isfinite(np.asarray(scale)))
    assert float(scale[1]) == 0.0 and not values[1].any()  # the zero row: no 0/0
    np.testing.assert_allclose(np.asarray(scale), np.abs(np.asarray(x)).max(axis=1) / top,
                               rtol=3e-7)  # XLA may divide by a reciprocal
    live = np.array([r for r in range(7) if r != 1])
    # each live row's largest element lands on the top code (no NaN from rounding past it)
    np.testing.assert_array_equal(np.abs(values[live]).max(axis=1), top)


def test_int8_row_codes_round_half_to_even():
    x = jnp.asarray([[254.0, 1.0, 3.0, 5.0, -1.0, -3.0]])  # scale 2: halves at +-0.5, 1.5, 2.5
    codes, scale = reference.quantize_rows(x, "int8")
    assert float(scale[0]) == 2.0
    np.testing.assert_array_equal(np.asarray(codes[0]), [127, 0, 2, 2, 0, -2])


def test_fp8_row_codes_are_the_nearest_e4m3_values():
    x = jnp.asarray([[448.0, 17.0, 0.3, -100.0, 1e-3]])  # scale 1: codes are x rounded
    codes, scale = reference.quantize_rows(x, "fp8")
    assert float(scale[0]) == 1.0
    expected = np.asarray(x, np.float32).astype(jnp.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(codes.astype(jnp.float32)), expected)


@cpu_only
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", ROW_COUNTS)
def test_w8a8_matches_its_reference_twin_in_both_layouts(fmt, rows):
    """Same codes on both sides: int8 sums are exact integers in either (K * 127^2 < 2^24);
    fp8 products are exact in f32 and only the summation order differs, by at most
    K ulps of sum |a_k b_k|. The epilogue's two multiplications add a few ulps more."""
    x = activations(rows)
    codes, x_scale = reference.quantize_rows(x, fmt)
    for w in both_layouts(fmt):
        out = jax.jit(w8a8.matmul)(x, w)
        twin = reference.w8a8_matmul(x, w)
        assert out.shape == (rows, N) and out.dtype == x.dtype
        w_codes = reference.dequantize(w) / w["scale"][None, :]  # [K, N] codes as f32
        magnitude = (jnp.abs(codes.astype(jnp.float32)) @ jnp.abs(w_codes)) \
            * x_scale[:, None] * w["scale"][None, :]
        slack = (K if fmt == "fp8" else 0) * 2 * EPS32 + 8 * EPS32
        assert np.all(np.abs(np.asarray(out - twin)) <= np.asarray(magnitude) * slack + 1e-30)


@cpu_only
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", ROW_COUNTS)
def test_w8a8_is_within_the_activation_quantization_error_of_weight_only(fmt, rows):
    """Both products use the same dequantized weights W, so their difference is (x~ - x) @ W,
    x~ the dequantized activations. Per element |x~ - x| <= s/2 for int8 (round to nearest,
    s = max|x| / 127), and for e4m3 <= 2^-4 |x| (3 mantissa bits, round to nearest) above the
    smallest normal, <= 2^-10 s in the subnormal steps of 2^-9 s: together <= 2^-4 |x| +
    2^-10 s. So |y - y_ref| <= e @ |W| elementwise, plus f32 rounding of two K-term sums."""
    x = activations(rows)
    top = reference.ACTIVATION_MAX[fmt]
    scale = jnp.max(jnp.abs(x), axis=1, keepdims=True) / top
    if fmt == "int8":
        per_element = jnp.broadcast_to(scale * 0.5, x.shape)
    else:
        per_element = 2.0 ** -4 * jnp.abs(x) + 2.0 ** -10 * scale
    for w in both_layouts(fmt):
        dense = reference.dequantize(w)  # [K, N] f32
        out = w8a8.matmul(x, w)
        weight_only = reference.matmul(x, w)
        bound = (per_element * (1 + 1e-5)) @ jnp.abs(dense) \
            + 4 * K * EPS32 * (jnp.abs(x) @ jnp.abs(dense))
        error = np.abs(np.asarray(out - weight_only))
        assert np.all(error <= np.asarray(bound) + 1e-30), float((error - bound).max())
        if rows >= 2:
            assert not np.asarray(out[1]).any()  # the zero row gives exact zeros, no NaN


@cpu_only
@pytest.mark.parametrize("fmt", FORMATS)
def test_bf16_activations_and_out_dtype(fmt):
    x = activations(7).astype(jnp.bfloat16)
    w = weight(fmt)
    out = w8a8.matmul(x, w, out_dtype=jnp.float32)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference.w8a8_matmul(
        x, w, out_dtype=jnp.float32)), rtol=1e-5, atol=1e-6)
    assert w8a8.matmul(x[None], w).shape == (1, 7, N)  # leading axes kept
    assert w8a8.matmul(x, w).dtype == jnp.bfloat16


@pytest.mark.parametrize("fmt", FORMATS)
def test_transposed_leaves_describe_the_same_weight(fmt):
    leaf = formats.quantize(np.random.default_rng(2).standard_normal((64, 48)), fmt)
    nk = w8a8.transposed(jax.tree.map(jnp.asarray, leaf))
    assert formats.format_of(nk) == f"{fmt}_nk" and nk[f"{fmt}_nk"].shape == (48, 64)
    assert formats.logical_shape(nk) == formats.logical_shape(leaf) == (64, 48)
    assert formats.stored_bytes(nk) == formats.stored_bytes(leaf)
    np.testing.assert_array_equal(formats.dequantize_numpy(jax.tree.map(np.asarray, nk)),
                                  formats.dequantize_numpy(leaf))
    np.testing.assert_array_equal(np.asarray(reference.dequantize(nk)),
                                  np.asarray(reference.dequantize(jax.tree.map(jnp.asarray,
                                                                               leaf))))


def test_transpose_leaves_touches_only_per_channel_leaves():
    rng = np.random.default_rng(3)
    plain = jnp.asarray(rng.standard_normal((32, 16)), jnp.float32)
    int4 = formats.quantize(rng.standard_normal((128, 16)), "int4")
    tree = {"embed": plain, "layers": [{"wqkv": weight("int8", 32, 16), "wo": int4,
                                        "w_down": weight("fp8", 32, 16)}]}
    out = w8a8.transpose_leaves(tree)
    layer = out["layers"][0]
    assert set(layer["wqkv"]) == {"int8_nk", "scale"} and set(layer["w_down"]) == {"fp8_nk",
                                                                                    "scale"}
    assert layer["wo"] is int4 and out["embed"] is plain


@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_lowering_hands_xla_one_8bit_dot_per_layout(fmt):
    """What XLA's GPU compiler receives: 8-bit codes on both sides of the one dot_general
    (nothing widened before it), a 32-bit result, the weight contracted on its K axis."""
    code, result = ("f8E4M3FN", "f32") if fmt == "fp8" else ("i8", "i32")
    x = activations(3).astype(jnp.bfloat16)
    for w, contracting in zip(both_layouts(fmt), ("[1] x [0]", "[1] x [1]")):
        dots = [line for line in lowers_for_cuda(w8a8.matmul, x, w).splitlines()
                if "dot_general" in line]
        assert len(dots) == 1 and f"contracting_dims = {contracting}" in dots[0]
        assert dots[0].count(f"x{code}>") == 2 and dots[0].endswith(f"x{result}>")


@needs_gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_w8a8_on_gpu_matches_its_twin(fmt, rows):
    """Natively (cuBLASLt / Triton GEMMs): the same codes, so only the accumulation differs
    (Hopper's fp8 tensor cores may accumulate in fewer than 32 bits)."""
    x = activations(rows).astype(jnp.bfloat16)
    for w in both_layouts(fmt):
        out = jax.jit(functools.partial(w8a8.matmul, out_dtype=jnp.float32))(x, w)
        twin = jax.jit(functools.partial(reference.w8a8_matmul, out_dtype=jnp.float32))(x, w)
        assert relative_error(out, twin) < 1e-3


# ----------------------------------------------------------------------------------- dispatch


@cpu_only
def test_the_cpu_keeps_the_weight_only_path_by_default(monkeypatch):
    """W8A8_MIN_ROWS is a GPU default: without NINFER_W8A8 the CPU never quantizes
    activations."""
    monkeypatch.delenv(quant_matmul.W8A8_ENV, raising=False)
    assert quant_matmul.W8A8_MIN_ROWS == 1 and quant_matmul.w8a8_min_rows() == 0
    assert not quant_matmul.w8a8_transposes_at_load()
    x = activations(7)
    for fmt in FORMATS:
        w = weight(fmt)
        np.testing.assert_array_equal(np.asarray(quant_matmul.matmul(x, w)),
                                      np.asarray(reference.matmul(x, w)))
        text = jax.jit(quant_matmul.matmul).lower(x, w).as_text()
        assert "round_nearest_even" not in text  # no activation quantization traced


@pytest.mark.parametrize("fmt", FORMATS)
def test_switch_on_for_every_row_count(monkeypatch, fmt):
    monkeypatch.setenv(quant_matmul.W8A8_ENV, "1")
    w = weight(fmt)
    for rows in (1, 64, 300):
        x = activations(rows)
        np.testing.assert_array_equal(np.asarray(quant_matmul.matmul(x, w)),
                                      np.asarray(w8a8.matmul(x, w)))
    code_type = "f8E4M3FN" if fmt == "fp8" else "xi8"
    text = jax.jit(quant_matmul.matmul).lower(activations(2), w).as_text()
    assert "dot_general" in text and code_type in text
    assert quant_matmul.w8a8_transposes_at_load()


@cpu_only
@pytest.mark.parametrize("fmt", FORMATS)
def test_switch_threshold_splits_by_rows(monkeypatch, fmt):
    monkeypatch.setenv(quant_matmul.W8A8_ENV, str(quant_matmul.DECODE_MAX_ROWS + 1))
    assert not quant_matmul.w8a8_transposes_at_load()
    w = weight(fmt)
    small, large = activations(quant_matmul.DECODE_MAX_ROWS), activations(65)
    np.testing.assert_array_equal(np.asarray(quant_matmul.matmul(small, w)),
                                  np.asarray(reference.matmul(small, w)))
    np.testing.assert_array_equal(np.asarray(quant_matmul.matmul(large, w)),
                                  np.asarray(w8a8.matmul(large, w)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_forced_reference_runs_the_twin_when_on(monkeypatch, fmt):
    monkeypatch.setenv(quant_matmul.W8A8_ENV, "1")
    monkeypatch.setenv(FORCE_REFERENCE_ENV, "1")
    x, w = activations(7), weight(fmt)
    np.testing.assert_array_equal(np.asarray(quant_matmul.matmul(x, w)),
                                  np.asarray(reference.w8a8_matmul(x, w)))
    monkeypatch.delenv(quant_matmul.W8A8_ENV)
    np.testing.assert_array_equal(np.asarray(quant_matmul.matmul(x, w)),
                                  np.asarray(reference.matmul(x, w)))


def test_transposed_leaves_always_take_w8a8(monkeypatch):
    monkeypatch.delenv(quant_matmul.W8A8_ENV, raising=False)
    x, w = activations(7), w8a8.transposed(weight("fp8"))
    np.testing.assert_array_equal(np.asarray(quant_matmul.matmul(x, w)),
                                  np.asarray(w8a8.matmul(x, w)))


@pytest.mark.parametrize("value", ["on", "-1", "1.5"])
def test_bad_switch_values_are_rejected(monkeypatch, value):
    monkeypatch.setenv(quant_matmul.W8A8_ENV, value)
    with pytest.raises(ValueError, match=quant_matmul.W8A8_ENV):
        quant_matmul.matmul(activations(2), weight("int8"))


@cpu_only
def test_other_formats_ignore_the_switch(monkeypatch):
    monkeypatch.setenv(quant_matmul.W8A8_ENV, "1")
    x = activations(7, k=128)
    w = jax.tree.map(jnp.asarray, formats.quantize(
        np.random.default_rng(4).standard_normal((128, 32)), "int4"))
    np.testing.assert_array_equal(np.asarray(quant_matmul.matmul(x, w)),
                                  np.asarray(reference.matmul(x, w)))
