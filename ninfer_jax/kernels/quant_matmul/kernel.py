"""Weight-only quantized matmul for decode shapes (few rows) as a Pallas kernel (GPU).

Lowering: Pallas' Triton backend (Mosaic GPU's interpreter on JAX 0.10 cannot run the copies a
Mosaic kernel needs, so it could not be tested in CI; Triton's is tested in interpret mode).

Each program owns `block_n` output columns and one split of K. It streams the packed weight
tiles, turns them into float16 in registers with integer tricks (no int->float conversion
instructions: the codes are OR-ed into a float16's mantissa or exponent bits and the constant
offset subtracted), applies group scales on the tile, and multiplies on the tensor cores with
float32 accumulation. x is pre-scaled per row into float16's comfortable range (|x| <= 256) so
activations larger than float16's maximum cannot overflow; the scale is undone in the epilogue,
together with per-channel scales and the split sum (a few kB of XLA work).
A single row of x (batch-1 decode) takes the FMA kernel in gemv.py instead.
Shape letters: M rows (padded to Mp >= 16, Triton's smallest tile), K in, N out.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ninfer_jax.kernels.quant_matmul.formats import format_of
from ninfer_jax.kernels.quant_matmul.gemv import NVFP4_EXPONENT_GAP, gemv
from ninfer_jax.kernels.quant_matmul.tuning import GROUP_SIZE, MatmulTuning, matmul_tuning

MIN_DOT_ROWS = 16
X_RANGE = 256.0  # rows of x are scaled so that max |x| == X_RANGE before the float16 cast
F16_ONE_THOUSAND_24 = 0x6400  # float16 bits of 1024.0: OR-ing n < 1024 into them gives 1024 + n
PACKED_FORMATS = ("int4", "nvfp4")


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _f16(bits):
    return lax.bitcast_convert_type(bits, jnp.float16)


def _unpack_pairs(packed):
    """uint8 [R, C] -> codes [R, 2C] (low nibble first), as Triton's join + reshape."""
    codes = jnp.stack([packed & 0xF, packed >> 4], axis=-1)
    return codes.reshape(packed.shape[0], packed.shape[1] * 2)


def _expand_groups(scale, rows: int):
    """Group scales [rows/g, C] -> one per row [rows, C]."""
    groups, cols = scale.shape
    if groups == 1:
        return jnp.broadcast_to(scale, (rows, cols))
    per_group = rows // groups
    return jnp.broadcast_to(scale[:, None, :], (groups, per_group, cols)).reshape(rows, cols)


def _tile_weights(fmt: str, raw, scale):
    """A weight tile as float16 [block_k, block_n] (per-channel scales not yet applied)."""
    if fmt == "int8":  # 1024 + 128 + q, exact in float16, minus 1152
        return _f16(raw.astype(jnp.int16) + (F16_ONE_THOUSAND_24 + 128)) - 1152.0
    if fmt == "fp8":
        return raw.astype(jnp.float16)  # one hardware conversion per pair on sm_89+
    codes = _unpack_pairs(raw).astype(jnp.uint16)
    if fmt == "int4":  # 1024 + u, minus 1024 + 8
        values = _f16(codes | F16_ONE_THOUSAND_24) - 1032.0
    else:  # e2m1 sign to bit 15, magnitude code to the top exponent/mantissa bits
        values = _f16(((codes & 8) << 12) | ((codes & 7) << 9))
    return values * _expand_groups(scale.astype(jnp.float16), raw.shape[0])


def _matmul_kernel(x_ref, w_ref, *refs, fmt: str, block_k: int, num_blocks: int):
    """One (column block, K split) program: dequantized tiles times x on the tensor cores."""
    scale_ref, o_ref = refs if len(refs) == 2 else (None, refs[0])
    group = GROUP_SIZE[fmt]

    def body(i, acc):
        k0 = pl.multiple_of(i * block_k, block_k)
        raw = w_ref[pl.ds(k0, block_k), :]
        scale = None
        if scale_ref is not None:
            scale = scale_ref[pl.ds(pl.multiple_of(i * (block_k // group), block_k // group),
                                    block_k // group), :]
        return acc + pltriton.dot(x_ref[:, pl.ds(k0, block_k)], _tile_weights(fmt, raw, scale))

    rows, cols = o_ref.shape
    o_ref[...] = lax.fori_loop(0, num_blocks, body, jnp.zeros((rows, cols), jnp.float32))


def _epilogue_scale(fmt: str, w):
    """What the kernel's float32 sums must still be multiplied by, per output column."""
    if fmt in ("int8", "fp8"):
        return w["scale"].astype(jnp.float32)
    if fmt == "nvfp4":
        return w["global_scale"].astype(jnp.float32) * NVFP4_EXPONENT_GAP
    return jnp.float32(1.0)


def matmul(x, w, *, out_dtype=None, tuning: MatmulTuning | None = None,
           interpret: bool = False):
    """x [..., K] @ quantized w ([Kp, N], Kp >= K) -> [..., N], for few rows of x.
    Returns None when the shape has no tiling (the caller falls back to the reference)."""
    fmt = format_of(w)
    codes = w[fmt]
    Kp = codes.shape[0]
    N = codes.shape[1] * (2 if fmt in PACKED_FORMATS else 1)
    lead, K = x.shape[:-1], x.shape[-1]
    M = x.size // K
    x2 = x.reshape(M, K).astype(jnp.float32)
    tuning = tuning or matmul_tuning(rows=M, k=Kp, n=N, fmt=fmt)
    if tuning is None:
        return None
    if not tuning.use_dot:  # one row: the FMA kernel, no pre-scaling of x needed
        x_row = jnp.pad(x.reshape(K), (0, Kp - K))
        out = gemv(x_row, w, fmt, n=N, tuning=tuning, interpret=interpret)[None, :]
        if fmt == "nvfp4":
            out = out * (w["global_scale"].astype(jnp.float32) * NVFP4_EXPONENT_GAP)
        return out.astype(out_dtype or x.dtype).reshape(*lead, N)
    Mp = max(MIN_DOT_ROWS, _next_power_of_2(M))
    row_scale = jnp.maximum(jnp.abs(x2).max(axis=1), 1e-30) / X_RANGE  # [M]
    x16 = jnp.pad(x2 / row_scale[:, None], ((0, Mp - M), (0, Kp - K))).astype(jnp.float16)
    partial = _matmul_call(x16, w, fmt=fmt, n=N, tuning=tuning, interpret=interpret)
    out = partial.sum(axis=0)[:M] * row_scale[:, None] * _epilogue_scale(fmt, w)
    return out.astype(out_dtype or x.dtype).reshape(*lead, N)


def _matmul_call(x16, w, *, fmt: str, n: int, tuning: MatmulTuning, interpret: bool):
    Mp, Kp = x16.shape
    bn, bk, NS = tuning.block_n, tuning.block_k, tuning.num_splits
    split_k = Kp // NS
    packed_bn = bn // 2 if fmt in PACKED_FORMATS else bn
    group = GROUP_SIZE[fmt]
    in_specs = [pl.BlockSpec((Mp, split_k), lambda j, s: (0, s)),
                pl.BlockSpec((split_k, packed_bn), lambda j, s: (s, j))]
    operands = [x16, w[fmt]]
    if group > 1:
        in_specs.append(pl.BlockSpec((split_k // group, bn), lambda j, s: (s, j)))
        operands.append(w["scale"])
    kernel = functools.partial(_matmul_kernel, fmt=fmt, block_k=bk, num_blocks=split_k // bk)
    return pl.pallas_call(
        kernel,
        grid=(n // bn, NS),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, Mp, bn), lambda j, s: (s, 0, j)),
        out_shape=jax.ShapeDtypeStruct((NS, Mp, n), jnp.float32),
        compiler_params=pltriton.CompilerParams(num_warps=tuning.num_warps,
                                                num_stages=tuning.num_stages),
        interpret=interpret,
        name=f"ninfer_{fmt}_matmul",
    )(*operands)
