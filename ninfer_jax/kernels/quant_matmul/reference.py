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
                                                      INT4_GROUP, INT4_OFFSET, NVFP4_GROUP,
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
    if fmt in BLOCK_FORMATS:
        return dequantize_blocks(leaf[fmt], fmt, dtype).T
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


def quantize_activations(x):
    """x [..., K] rounded as the CPU block kernel rounds it before its integer dots: per block
    of 32, scale = max|x| / 127 and codes round(x / scale) (llama.cpp's q8 activations)."""
    blocks = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, BLOCK_SIZE)
    scale = jnp.max(jnp.abs(blocks), axis=-1, keepdims=True) / 127.0
    inverse = jnp.where(scale > 0, 1.0 / jnp.where(scale > 0, scale, 1.0), 0.0)
    return (jnp.round(blocks * inverse) * scale).reshape(x.shape)
