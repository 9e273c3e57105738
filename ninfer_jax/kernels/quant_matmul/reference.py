"""Pure-jnp twin of the quantized matmul (the CPU path, the prefill path and the test oracle).

`matmul(x, w)` dequantizes the whole weight leaf to x's dtype and calls one XLA matmul. For
prefill shapes on the GPU that is close to the bf16 matmul rate (the dequantization is one
fused pass over the weights, small next to a large-M product); for decode shapes the Pallas
kernel (kernel.py) reads the packed bytes directly instead.
Leaf layouts are described in formats.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ninfer_jax.kernels.quant_matmul.formats import (BLOCK_BYTES, BLOCK_FORMATS, BLOCK_SIZE,
                                                      INT4_GROUP, INT4_OFFSET, INTERLEAVE,
                                                      INTERLEAVED_FORMATS, NVFP4_GROUP,
                                                      TRANSPOSED_FORMATS, deinterleave_order,
                                                      format_of)


def unpack_nibbles(packed):
    """uint8 [K, N/2] -> uint8 codes [K, N] (column 2j from the low nibble)."""
    lo, hi = packed & 0xF, packed >> 4
    return jnp.stack([lo, hi], axis=-1).reshape(packed.shape[0], packed.shape[1] * 2)


def e2m1_values(codes):
    """e2m1 codes (uint8, 0..15) -> f32 values, by placing the 3 magnitude bits in a float16's
    exponent/mantissa fields and rescaling (exact for every code, subnormal 0.5 included)."""
    codes = codes.astype(jnp.int32)
    bits = ((codes & 8) << 12) | ((codes & 7) << 9)
    half = jax.lax.bitcast_convert_type(bits.astype(jnp.uint16), jnp.float16)
    return half.astype(jnp.float32) * 16384.0  # 2 ** 14 undoes the float16 exponent bias gap


def dequantize(leaf, dtype=jnp.float32):
    """The [Kp, N] weights a leaf stands for, in `dtype`."""
    fmt = format_of(leaf)
    if fmt == "bf16":
        return leaf.astype(dtype)
    if fmt in ("int8", "fp8"):
        return (leaf[fmt].astype(jnp.float32) * leaf["scale"][None, :]).astype(dtype)
    if fmt in TRANSPOSED_FORMATS:
        return dequantize({TRANSPOSED_FORMATS[fmt]: leaf[fmt].T, "scale": leaf["scale"]}, dtype)
    if fmt in BLOCK_FORMATS:
        return dequantize_blocks(leaf[fmt], fmt, dtype).T
    if fmt in INTERLEAVED_FORMATS:
        return dequantize_blocks(*deinterleave(leaf[fmt], fmt), dtype).T
    codes = unpack_nibbles(leaf[fmt])
    if fmt == "int4":
        values = codes.astype(jnp.float32) - INT4_OFFSET
        scale, group = leaf["scale"].astype(jnp.float32), INT4_GROUP
    else:
        values = e2m1_values(codes)
        scale = leaf["scale"].astype(jnp.float32) * leaf["global_scale"]
        group = NVFP4_GROUP
    return (values * jnp.repeat(scale, group, axis=0)).astype(dtype)


def matmul(x, w, *, out_dtype=None):
    """x [..., K] @ w (any format, [Kp, N] with Kp >= K) -> [..., N] in out_dtype or x's."""
    weights = dequantize(w, x.dtype)
    K = x.shape[-1]
    if weights.shape[0] != K:
        weights = weights[:K]  # group padding rows are zeros
    return jnp.matmul(x, weights, preferred_element_type=out_dtype)


def _f16_at(blocks, start):
    """The float16 stored little-endian at byte `start` of each block -> f32 [..., nb]."""
    lo = blocks[..., start].astype(jnp.uint16)
    hi = blocks[..., start + 1].astype(jnp.uint16)
    return jax.lax.bitcast_convert_type(lo | (hi << 8), jnp.float16).astype(jnp.float32)


def dequantize_blocks(raw, fmt, dtype=jnp.float32):
    """GGUF block bytes [R, nb * block bytes] -> the [R, nb * 32] values they stand for (the
    rows of ggml's [N, K] layout: output columns of a projection, or embedding table rows)."""
    blocks = raw.reshape(*raw.shape[:-1], -1, BLOCK_BYTES[fmt])
    d = _f16_at(blocks, 0)[..., None]
    if fmt == "q8_0":
        values = jax.lax.bitcast_convert_type(blocks[..., 2:], jnp.int8).astype(jnp.float32) * d
    else:
        qs = blocks[..., 4:] if fmt == "q4_1" else blocks[..., 2:]
        codes = jnp.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(jnp.float32)
        values = (codes - 8.0) * d if fmt == "q4_0" else codes * d + _f16_at(blocks, 2)[..., None]
    return values.reshape(*raw.shape[:-1], -1).astype(dtype)


def deinterleave(raw, fmt):
    """An interleaved leaf's bytes [N/16, 16 * nb * bb] -> (block rows [N, nb * bb], their
    block format): the row layout again (formats.interleave_order's inverse)."""
    base = INTERLEAVED_FORMATS[fmt]
    row = raw.shape[1] // INTERLEAVE
    order = deinterleave_order(base, row // BLOCK_BYTES[base])
    return jnp.take(raw, order, axis=1).reshape(raw.shape[0] * INTERLEAVE, row), base


def block_rows(raw, fmt, rows):
    """Block rows [..., nb * bb] of a block table at indices `rows` (a tied embedding table's
    lookup) and their block format, from either layout: an interleaved table gathers each
    row's group and picks the row's bytes out of it."""
    if fmt in BLOCK_FORMATS:
        return jnp.take(raw, rows, axis=0), fmt
    base = INTERLEAVED_FORMATS[fmt]
    row = raw.shape[1] // INTERLEAVE
    lanes = jnp.asarray(deinterleave_order(base, row // BLOCK_BYTES[base]).reshape(
        INTERLEAVE, row))
    groups = jnp.take(raw, rows // INTERLEAVE, axis=0)  # [..., 16 * row]
    return jnp.take_along_axis(groups, jnp.take(lanes, rows % INTERLEAVE, axis=0), axis=-1), base


def quantize_activations(x):
    """x [..., K] as the CPU block kernel quantizes it before its integer dots (llama.cpp's q8_0 /
    q8_1 activation blocks): per block of 32, codes round-half-even(x * 127 / max|x|), the
    scale d = max|x| / 127 rounded to f16 and s = d * sum(codes) rounded to f16 (q8_1's, for
    q4_1's offset). Returns (codes f32 [..., nb, 32], d [..., nb], s [..., nb])."""
    blocks = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, BLOCK_SIZE)
    amax = jnp.max(jnp.abs(blocks), axis=-1)
    inverse = jnp.where(amax > 0, 127.0 / jnp.where(amax > 0, amax, 1.0), 0.0)
    codes = jnp.round(blocks * inverse[..., None])
    scale = amax / 127.0
    half = lambda v: v.astype(jnp.float16).astype(jnp.float32)
    return codes, half(scale), half(scale * codes.sum(axis=-1))


def block_matmul(x, raw, fmt):
    """x [M, K] @ the GGUF block leaf's bytes raw [N, K/32 * block bytes] -> [M, N], computed
    as the CPU kernel computes it (the oracle of its tests): per block, the integer dot of the
    activation codes with the weight codes times d_w * d_x, plus q4_1's m * s (q4_0's codes
    are offset by -8 before the dot), all in f32; only the summation order differs."""
    codes, d, s = quantize_activations(x)
    blocks = raw.reshape(raw.shape[0], -1, BLOCK_BYTES[fmt])
    dw = _f16_at(blocks, 0)
    if fmt == "q8_0":
        w = jax.lax.bitcast_convert_type(blocks[..., 2:], jnp.int8).astype(jnp.float32)
    else:
        qs = blocks[..., 4:] if fmt == "q4_1" else blocks[..., 2:]
        w = jnp.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(jnp.float32)
        w = w - 8.0 if fmt == "q4_0" else w
    dots = jnp.einsum("mbk,nbk->mnb", codes, w, precision=jax.lax.Precision.HIGHEST)
    y = jnp.sum(dots * d[:, None, :] * dw[None], axis=-1)
    if fmt == "q4_1":
        y = y + jnp.einsum("mb,nb->mn", s, _f16_at(blocks, 2),
                           precision=jax.lax.Precision.HIGHEST)
    return y


# W8A8: the largest code of an activation row and the 8-bit type it is stored in
ACTIVATION_MAX = {"int8": 127.0, "fp8": 448.0}
ACTIVATION_DTYPE = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}


def quantize_rows(x, fmt):
    """x [M, K] -> (8-bit codes [M, K], f32 scale [M]) with x ~ codes * scale[:, None], one
    dynamic scale per row (token): scale = max|x| / 127 (int8, codes rounded half to even) or
    max|x| / 448 (fp8 e4m3, the conversion rounds to nearest even). An all-zero row gets
    scale 0 and zero codes. Codes are clipped to the range: x * (448 / max|x|) may round past
    448, which e4m3fn (no infinities) would turn into NaN."""
    x = x.astype(jnp.float32)
    top = ACTIVATION_MAX[fmt]
    amax = jnp.max(jnp.abs(x), axis=-1)
    inverse = jnp.where(amax > 0, top / jnp.where(amax > 0, amax, 1.0), 0.0)
    scaled = jnp.clip(x * inverse[:, None], -top, top)
    if fmt == "int8":
        scaled = jnp.round(scaled)  # half to even
    return scaled.astype(ACTIVATION_DTYPE[fmt]), amax / top


def w8a8_matmul(x, w, *, out_dtype=None):
    """The W8A8 product (w8a8.py) written with explicit f32 dequantization: x [..., K] @ an
    int8 / fp8 per-channel leaf ([K, N] or the load's [N, K]) -> [..., N] in out_dtype or x's.
    x is quantized per row exactly as w8a8.matmul does; both operands' codes are widened to
    f32 (exact) and multiplied at full f32 precision; the scales are applied after the sum."""
    fmt = format_of(w)
    base = TRANSPOSED_FORMATS.get(fmt, fmt)
    lead, K = x.shape[:-1], x.shape[-1]
    codes, x_scale = quantize_rows(x.reshape(-1, K), base)
    weights = w[fmt].astype(jnp.float32)
    weights = weights.T if fmt in TRANSPOSED_FORMATS else weights  # [K, N]
    sums = jnp.matmul(codes.astype(jnp.float32), weights, precision=jax.lax.Precision.HIGHEST)
    out = sums * x_scale[:, None] * w["scale"].astype(jnp.float32)[None, :]
    return out.astype(out_dtype or x.dtype).reshape(*lead, weights.shape[1])
