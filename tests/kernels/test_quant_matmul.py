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
from ninfer_jax.kernels.quant_matmul.tuning import (ONE_ROW_DOT_FORMATS, MatmulTuning,
                                                    matmul_tuning)
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


# The 4-bit cases of the tensor-core kernel, and one row padded to 16 (ONE_ROW_DOT_FORMATS)
PACKED_DOT_GRID = [case for case in KERNEL_GRID if case[0] in kernel.PACKED_FORMATS
                   and case[4] is not None and case[4].use_dot] + [
    ("int4", 1, 512, 64, MatmulTuning(block_n=32, block_k=256, num_splits=2)),
    ("nvfp4", 1, 256, 96, MatmulTuning(block_n=32, block_k=64, num_splits=2))]


@cpu_only
@pytest.mark.parametrize("layout", kernel.PACKED_LAYOUT_CHOICES)
@pytest.mark.parametrize("fmt,rows,k,n,tuning", PACKED_DOT_GRID)
def test_both_4bit_layouts_match_the_reference_in_interpret_mode(fmt, rows, k, n, tuning,
                                                                  layout, monkeypatch):
    """kernel.PACKED_LAYOUT: one interleaved tile, or even and odd columns as two tiles (int4
    scaling each group's dot, a 256-row tile holding two groups)."""
    monkeypatch.setattr(kernel, "PACKED_LAYOUT", layout)
    w = quantized(fmt, k, n, seed=rows)
    x = jnp.asarray(gaussian(rows, k, seed=7) * 30)
    out = jax.jit(functools.partial(kernel.matmul, tuning=tuning, interpret=True))(x, w)
    assert out.shape == (rows, n)
    assert relative_error(out, reference.matmul(x, w)) < 2e-3


def test_one_row_goes_to_the_tensor_core_kernel_for_the_listed_formats(monkeypatch):
    from ninfer_jax.kernels.quant_matmul import tuning
    assert tuning.ONE_ROW_DOT_FORMATS == {"int4", "nvfp4", "fp8"}  # run 49's choice
    monkeypatch.setattr(tuning, "ONE_ROW_DOT_FORMATS", frozenset())
    assert not matmul_tuning(rows=1, k=4096, n=256, fmt="int4").use_dot
    monkeypatch.setattr(tuning, "ONE_ROW_DOT_FORMATS", frozenset({"int4"}))
    assert matmul_tuning(rows=1, k=4096, n=256, fmt="int4").use_dot
    assert not matmul_tuning(rows=1, k=4096, n=256, fmt="int8").use_dot
    assert not matmul_tuning(rows=1, k=4096, n=256, fmt="int4", use_dot=False).use_dot
    w = quantized("int4", 4096, 256)
    # a fresh callable: jit's trace cache must not hand this trace to other tests
    fresh = functools.partial(kernel.matmul)
    assert "ninfer_int4_matmul" in lowers_for_cuda(fresh, jnp.zeros((1, 4096), jnp.bfloat16), w)


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
            assert t.use_dot == (rows > 1 or fmt in ONE_ROW_DOT_FORMATS)
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
    from ninfer_jax.kernels.quant_matmul import tuning
    monkeypatch.setattr(gemv, "FP8_WIDEN", widening)
    monkeypatch.setattr(tuning, "ONE_ROW_DOT_FORMATS", frozenset())
    w = quantized("fp8", 512, 256)
    fresh = functools.partial(kernel.matmul)  # not jit's trace of another test's settings
    assert "ninfer_fp8_gemv" in lowers_for_cuda(fresh, jnp.zeros((1, 512), jnp.bfloat16), w)


@pytest.mark.parametrize("fmt", kernel.PACKED_FORMATS)
@pytest.mark.parametrize("rows", [1, 8])
def test_halves_layout_lowers_for_cuda(fmt, rows, monkeypatch):
    monkeypatch.setattr(kernel, "PACKED_LAYOUT", "halves")
    w = quantized(fmt, 4096, 256)
    x = jnp.zeros((rows, 4096), jnp.bfloat16)
    tuning = matmul_tuning(rows=rows, k=4096, n=256, fmt=fmt, use_dot=True)
    assert f"ninfer_{fmt}_matmul" in lowers_for_cuda(
        functools.partial(kernel.matmul, tuning=tuning), x, w)


def _lowers(fmt, rows):
    w = quantized(fmt, 4096 if fmt == "int4" else 512, 256)
    x = jnp.zeros((rows, w[fmt].shape[0]), jnp.bfloat16)
    one_row_fma = rows == 1 and fmt not in ONE_ROW_DOT_FORMATS
    name = f"ninfer_{fmt}_gemv" if one_row_fma else f"ninfer_{fmt}_matmul"
    assert name in lowers_for_cuda(kernel.matmul, x, w)


@needs_gpu
@pytest.mark.parametrize("widening", gemv.FP8_WIDEN_CHOICES)
def test_one_row_fp8_kernel_on_gpu_matches_reference_either_way(widening, monkeypatch):
    from ninfer_jax.kernels.quant_matmul import tuning
    monkeypatch.setattr(gemv, "FP8_WIDEN", widening)
    monkeypatch.setattr(tuning, "ONE_ROW_DOT_FORMATS", frozenset())
    test_kernel_on_gpu_matches_reference("fp8", 1)


@needs_gpu
@pytest.mark.parametrize("fmt", COLUMN_FORMATS)
def test_one_row_fma_kernel_on_gpu_matches_reference(fmt, monkeypatch):
    """The one-row FMA kernel (gemv.py) for every format, ONE_ROW_DOT_FORMATS or not."""
    from ninfer_jax.kernels.quant_matmul import tuning
    monkeypatch.setattr(tuning, "ONE_ROW_DOT_FORMATS", frozenset())
    test_kernel_on_gpu_matches_reference(fmt, 1)


@needs_gpu
@pytest.mark.parametrize("fmt", kernel.PACKED_FORMATS)
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_halves_layout_on_gpu_matches_reference(fmt, rows, monkeypatch):
    from ninfer_jax.kernels.quant_matmul import tuning
    monkeypatch.setattr(kernel, "PACKED_LAYOUT", "halves")
    monkeypatch.setattr(tuning, "ONE_ROW_DOT_FORMATS", frozenset(kernel.PACKED_FORMATS))
    test_kernel_on_gpu_matches_reference(fmt, rows)


@needs_gpu
@pytest.mark.parametrize("fmt", COLUMN_FORMATS)
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_kernel_on_gpu_matches_reference(fmt, rows):
    w = quantized(fmt, 1024, 768, seed=rows)
    x = jnp.asarray(gaussian(rows, 1024, seed=8), jnp.bfloat16)
    # a fresh callable: the kernel's switches are read while tracing, and jit would hand back
    # another test's trace of the same shapes
    out = jax.jit(functools.partial(kernel.matmul))(x, w)
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


def _run_ptx(asm: str, word: int) -> list:
    """The few PTX instructions of kernel._INT4_PTX / _NVFP4_PTX on one 32-bit input word
    ($2); returns [$0, $1]. A check of the bit logic on the CPU (the GPU test runs the real
    thing)."""
    regs = {"$2": word}

    def value(token):
        token = token.strip()
        return int(token, 16) if token.startswith("0x") else (
            int(token) if token.isdigit() else regs[token])

    def f16x2(bits):
        return np.array([bits & 0xFFFF, bits >> 16], np.uint16).view(np.float16)

    for line in asm.strip().strip("{}").splitlines():
        line = line.strip().rstrip(";")
        if not line or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        dst, *srcs = [part.strip() for part in rest.split(",")]
        args = [value(s) for s in srcs]
        if op == "shr.b32":
            out = args[0] >> args[1]
        elif op == "shl.b32":
            out = (args[0] << args[1]) & 0xFFFFFFFF
        elif op == "and.b32":
            out = args[0] & args[1]
        elif op == "or.b32":
            out = args[0] | args[1]
        elif op == "mov.b32":
            out = args[0]
        elif op == "lop3.b32":
            a, b, c, lut = args
            out = sum(((lut >> ((a >> i & 1) << 2 | (b >> i & 1) << 1 | (c >> i & 1))) & 1) << i
                      for i in range(32))
        elif op == "prmt.b32":
            pool = (args[1] << 32) | args[0]
            out = sum(((pool >> (8 * ((args[2] >> (4 * i)) & 7))) & 0xFF) << (8 * i)
                      for i in range(4))
        elif op == "sub.f16x2":
            diff = (f16x2(args[0]) - f16x2(args[1])).astype(np.float16).view(np.uint16)
            out = int(diff[0]) | int(diff[1]) << 16
        else:
            raise AssertionError(f"no interpreter for {op}")
        regs[dst] = out
    return [regs["$0"], regs["$1"]]


@pytest.mark.parametrize("fmt", kernel.PACKED_FORMATS)
def test_the_nibble_ptx_decodes_every_byte_as_its_jnp_twin(fmt):
    """kernel.NIBBLE_DECODE "ptx": four bytes in a word (byte i = element i), each nibble's
    float16 pairs out as ((0, 1), (2, 3)), equal to _nibble_tile's for all 256 byte values."""
    template = kernel._INT4_PTX if fmt == "int4" else kernel._NVFP4_PTX
    rng = np.random.default_rng(0)
    raw = np.concatenate([np.arange(256), rng.integers(0, 256, 256)]).astype(np.uint8)
    for shift, nibbles in ((0, raw & 0xF), (4, raw >> 4)):
        want = np.asarray(kernel._nibble_tile(fmt, jnp.asarray(nibbles))).view(np.uint16)
        asm = template % {"shift": shift, "shift_b": shift + 8}
        got = []
        for word in raw.reshape(-1, 4):
            pairs = _run_ptx(asm, int(word.view("<u4")[0]))
            got += [pairs[0] & 0xFFFF, pairs[0] >> 16, pairs[1] & 0xFFFF, pairs[1] >> 16]
        np.testing.assert_array_equal(np.array(got, np.uint16), want)


@pytest.mark.parametrize("fmt", kernel.PACKED_FORMATS)
def test_the_nibble_ptx_lowers_for_cuda(fmt, monkeypatch):
    monkeypatch.setattr(kernel, "NIBBLE_DECODE", "ptx")
    w = quantized(fmt, 4096, 256)
    fresh = functools.partial(kernel.matmul)
    text = lowers_for_cuda(fresh, jnp.zeros((8, 4096), jnp.bfloat16), w)
    assert f"ninfer_{fmt}_matmul" in text


@needs_gpu
@pytest.mark.parametrize("fmt", kernel.PACKED_FORMATS)
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_the_nibble_ptx_on_gpu_matches_reference(fmt, rows, monkeypatch):
    monkeypatch.setattr(kernel, "NIBBLE_DECODE", "ptx")
    test_kernel_on_gpu_matches_reference(fmt, rows)
