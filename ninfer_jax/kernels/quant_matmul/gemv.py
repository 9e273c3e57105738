"""One-row weight-only quantized matmul (batch-1 decode) as a Pallas kernel (GPU).

x [1, K] @ w: each program owns `block_n` output columns and one split of K and keeps float32
partial sums per weight element in registers (no tensor cores: with one row they would idle
15/16 of the time, and handing them dequantized tiles costs a trip through shared memory). The
K reduction happens once, after the loop. Per-channel scales are applied in the kernel; only the
split sum (and nvfp4's global scale) is left to a single small XLA fusion.

4-bit weights are never interleaved in registers: the low and high nibbles of a byte (columns
2j and 2j+1) are accumulated separately and interleaved once per program at the end. Group
formats are read through free row-major reshapes as [groups, group, N/2] (codes), [groups,
N/2, 2] (scales: the two columns of a byte side by side) and [groups, group] (x), so each
group's scale is broadcast, never expanded.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ninfer_jax.kernels.quant_matmul.tuning import GROUP_SIZE, MatmulTuning

# Float32 bits of 2**23: OR-ing or adding an integer n < 2**23 into its mantissa gives 2**23 + n.
F32_2_POW_23 = 0x4B000000
NVFP4_EXPONENT_GAP = 16384.0  # e2m1 bits placed in a float16 come out 2**-14 too small
# How the one-row kernel widens fp8 (e4m3) codes, read while tracing (so a benchmark can set
# the module's value before it jits): "float32" widens them to float32 for a float32 FMA;
# "float16" widens them to float16 (one instruction per pair of codes on Hopper, where Triton's
# float32 path adds a conversion per code) and multiplies them by x in float16, each product
# summed in float32. x is scaled per program by a power of two so its peak is at most
# FP8_X_PEAK: 128 x 448 (e4m3's largest) stays below float16's 65504 whatever x holds.
# The default stays "float32" until a GPU figure (kernel_bench gemvsweep, "widen") says
# otherwise. (The multi-row kernel, kernel.py, always widens fp8 tiles to float16.)
FP8_WIDEN = "float32"
FP8_WIDEN_CHOICES = ("float32", "float16")
FP8_X_PEAK = 128.0

# int8 and int4 codes become float32 with one integer add/OR and one float add, avoiding the
# int->float conversion instructions (a quarter of the FMA rate on Hopper): int8 went from
# 1.50-1.65 to 1.78 TB/s. For e2m1 the same trick needs a select for the subnormal code and
# measured slower (0.54 TB/s) than the float16 placement used here (0.75 TB/s).


def _f32(bits):
    return lax.bitcast_convert_type(bits, jnp.float32)


def _nibble_values(fmt: str, nibbles):
    """uint8 nibbles (0..15) -> float32 values (int4: code - 8; nvfp4: e2m1 * 2**-14)."""
    if fmt == "int4":
        return _f32(nibbles.astype(jnp.int32) | F32_2_POW_23) - float(2 ** 23 + 8)
    codes = nibbles.astype(jnp.uint16)
    half = lax.bitcast_convert_type(((codes & 8) << 12) | ((codes & 7) << 9), jnp.float16)
    return half.astype(jnp.float32)


def _byte_values(fmt: str, raw):
    """int8 / fp8 / bf16 tile -> float32 values (per-channel scale not applied)."""
    if fmt == "int8":  # 2**23 + 128 + q, exact in float32
        return _f32(raw.astype(jnp.int32) + (F32_2_POW_23 + 128)) - float(2 ** 23 + 128)
    return raw.astype(jnp.float32)


# "bf16" is not a weight format: the model's float weights go to XLA. The one-row kernel
# takes plain bf16 tiles (w = {"bf16": weight, "scale": ones}) so that kernel_bench's
# gemvsweep can tell the loop's own bandwidth apart from the cost of widening codes: if bf16
# tiles stream no faster than int8 codes, the loop, not the conversion, is the limit.
BYTE_FORMATS = ("int8", "fp8", "bf16")


def fp8_widens_to_f16(fmt: str) -> bool:
    """Whether the one-row kernel multiplies `fmt` codes in float16 (FP8_WIDEN "float16" and
    fp8 codes); read while tracing."""
    if FP8_WIDEN not in FP8_WIDEN_CHOICES:
        raise ValueError(f"FP8_WIDEN={FP8_WIDEN!r}: expected one of {FP8_WIDEN_CHOICES}")
    return FP8_WIDEN == "float16" and fmt == "fp8"


def _byte_kernel(x_ref, w_ref, scale_ref, o_ref, *, fmt: str, block_k: int, num_blocks: int,
                 f16: bool):
    """int8 / fp8 / bf16: x_ref [split_k], w_ref [split_k, bn], scale_ref [bn], o_ref [bn].
    f16 (fp8_widens_to_f16): codes and x in float16, x over 2^e (its split's peak near
    FP8_X_PEAK; exact), the 2^e applied with the per-channel scale."""
    x_unit = 1.0
    if f16:
        peak = jnp.maximum(jnp.abs(x_ref[...].astype(jnp.float32)).max(), 1e-30)
        exponent = jnp.ceil(jnp.log2(peak / FP8_X_PEAK))
        x_unit, x_inverse = jnp.exp2(exponent), jnp.exp2(-exponent)

    def body(i, acc):
        k0 = pl.multiple_of(i * block_k, block_k)
        x = x_ref[pl.ds(k0, block_k)].astype(jnp.float32)
        raw = w_ref[pl.ds(k0, block_k), :]
        if f16:
            x16 = (x * x_inverse).astype(jnp.float16)
            return acc + (x16[:, None] * raw.astype(jnp.float16)).astype(jnp.float32)
        return acc + x[:, None] * _byte_values(fmt, raw)

    cols = o_ref.shape[0]
    acc = lax.fori_loop(0, num_blocks, body, jnp.zeros((block_k, cols), jnp.float32))
    o_ref[...] = acc.sum(axis=0) * (scale_ref[...] * x_unit)


def split_pairs(pairs):
    """[..., 2] -> the two [...] halves (Triton splits only the last axis)."""
    first, second = jnp.split(pairs, 2, axis=-1)
    return first.reshape(pairs.shape[:-1]), second.reshape(pairs.shape[:-1])


def _nibble_kernel(x_ref, w_ref, scale_ref, o_ref, *, fmt: str, groups_per_step: int,
                   num_blocks: int):
    """int4 / nvfp4: x_ref [g_split, g], w_ref [g_split, g, bn/2] bytes, scale_ref
    [g_split, bn/2, 2], o_ref [bn]. Each step covers `groups_per_step` whole groups."""
    def body(i, carry):
        acc_lo, acc_hi = carry
        g0 = pl.multiple_of(i * groups_per_step, groups_per_step)
        x = x_ref[pl.ds(g0, groups_per_step), :].astype(jnp.float32)[:, :, None]
        raw = w_ref[pl.ds(g0, groups_per_step), :, :]
        scale_lo, scale_hi = split_pairs(scale_ref[pl.ds(g0, groups_per_step), :, :]
                                     .astype(jnp.float32))
        acc_lo += (x * scale_lo[:, None, :]) * _nibble_values(fmt, raw & 0xF)
        acc_hi += (x * scale_hi[:, None, :]) * _nibble_values(fmt, raw >> 4)
        return acc_lo, acc_hi

    _, group, half = w_ref.shape
    zeros = jnp.zeros((groups_per_step, group, half), jnp.float32)
    acc_lo, acc_hi = lax.fori_loop(0, num_blocks, body, (zeros, zeros))
    out_lo = acc_lo.sum(axis=0).sum(axis=0)
    out_hi = acc_hi.sum(axis=0).sum(axis=0)
    o_ref[...] = jnp.stack([out_lo, out_hi], axis=-1).reshape(2 * half)


def gemv(x_row, w, fmt: str, *, n: int, tuning: MatmulTuning, interpret: bool = False):
    """x_row [Kp] (any float dtype) @ w -> float32 [n], before nvfp4's global scale."""
    bn, bk, NS = tuning.block_n, tuning.block_k, tuning.num_splits
    Kp = x_row.shape[0]
    split_k = Kp // NS
    codes = w[fmt]
    if fmt in BYTE_FORMATS:
        kernel = functools.partial(_byte_kernel, fmt=fmt, block_k=bk, num_blocks=split_k // bk,
                                   f16=fp8_widens_to_f16(fmt))
        operands = (x_row, codes, w["scale"].astype(jnp.float32))
        in_specs = [pl.BlockSpec((split_k,), lambda j, s: (s,)),
                    pl.BlockSpec((split_k, bn), lambda j, s: (s, j)),
                    pl.BlockSpec((bn,), lambda j, s: (j,))]
    else:
        group = GROUP_SIZE[fmt]
        groups, g_split = Kp // group, split_k // group
        per_step = bk // group
        kernel = functools.partial(_nibble_kernel, fmt=fmt, groups_per_step=per_step,
                                   num_blocks=g_split // per_step)
        operands = (x_row.reshape(groups, group), codes.reshape(groups, group, n // 2),
                    w["scale"].reshape(groups, n // 2, 2))
        in_specs = [pl.BlockSpec((g_split, group), lambda j, s: (s, 0)),
                    pl.BlockSpec((g_split, group, bn // 2), lambda j, s: (s, 0, j)),
                    pl.BlockSpec((g_split, bn // 2, 2), lambda j, s: (s, j, 0))]
    partial = pl.pallas_call(
        kernel,
        grid=(n // bn, NS),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, bn), lambda j, s: (s, j)),
        out_shape=jax.ShapeDtypeStruct((NS, n), jnp.float32),
        compiler_params=pltriton.CompilerParams(num_warps=tuning.num_warps,
                                                num_stages=tuning.num_stages),
        interpret=interpret,
        name=f"ninfer_{fmt}_gemv",
    )(*operands)
    return partial.sum(axis=0)
