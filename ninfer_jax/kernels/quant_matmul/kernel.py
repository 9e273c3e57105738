"""Weight-only quantized matmul for decode shapes (few rows) as a Pallas kernel (GPU).

Lowering: Pallas' Triton backend (Mosaic GPU's interpreter on JAX 0.10 cannot run the copies a
Mosaic kernel needs, so it could not be tested in CI; Triton's is tested in interpret mode).

Each program owns `block_n` output columns and one split of K. It streams the packed weight
tiles, turns them into float16 in registers with integer tricks (no int->float conversion
instructions: the codes are OR-ed into a float16's mantissa or exponent bits and the constant
offset subtracted), applies group scales on the tile (int4: on each group's dot), and
multiplies on the tensor cores with float32 accumulation; 4-bit codes go as two half tiles
(PACKED_LAYOUT). x is pre-scaled per row into float16's comfortable range (|x| <= 256) so
activations larger than float16's maximum cannot overflow; the scale is undone in the epilogue,
together with per-channel scales and the split sum (a few kB of XLA work).
A single row of x (batch-1 decode) takes the FMA kernel in gemv.py instead, except for the
formats in tuning.ONE_ROW_DOT_FORMATS, which pad it to 16 rows here.
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
from ninfer_jax.kernels.quant_matmul.gemv import NVFP4_EXPONENT_GAP, gemv, split_pairs
from ninfer_jax.kernels.quant_matmul.tuning import GROUP_SIZE, MatmulTuning, matmul_tuning
from ninfer_jax.kernels.tiling import next_power_of_2

MIN_DOT_ROWS = 16
X_RANGE = 256.0  # rows of x are scaled so that max |x| == X_RANGE before the float16 cast
F16_ONE_THOUSAND_24 = 0x6400  # float16 bits of 1024.0: OR-ing n < 1024 into them gives 1024 + n
PACKED_FORMATS = ("int4", "nvfp4")
# How the multi-row kernel feeds 4-bit codes to the tensor cores, read while tracing (so a
# benchmark can set the module's value before it jits): "interleave" unpacks a byte tile into
# one [block_k, block_n] tile (a join and a reshape between the load and the dot, which Triton
# routes through a layout conversion); "halves" multiplies the even and the odd columns as two
# tiles (_halves_kernel) and interleaves the sums once per call. Run 49 (H200, 4096 x 14336,
# best tiles): int4 at 1 / 8 / 64 rows 37.7 / 34.2 / 72.6 us as halves against 68.2 / 69.8 /
# 96.2 interleaved, nvfp4 49.5 / 42.8 / 72.0 against 76.8 / 67.5 / 82.4 (docs/benchmarks.md).
PACKED_LAYOUT = "halves"
PACKED_LAYOUT_CHOICES = ("interleave", "halves")


# How the half-tile kernel decodes a byte tile on the GPU, read while tracing: "jnp" (elementwise
# ops per code, which Triton runs one 32-bit instruction per code or more) or "ptx" (inline PTX
# on 32-bit words holding four codes' bytes: a mask and a shift give two codes' nibbles in the
# low bits of two 16-bit lanes, a byte permute puts neighbours together, and int4's nibbles
# OR-ed into float16 1024 minus 1032 become code - 8 in one float16x2 subtract: 10 instructions
# for 4 int4 codes). Interpret mode (the CPU) always runs "jnp", the twin; the PTX's bit logic is
# checked on the CPU by a small interpreter of its instructions (tests/kernels). Not yet run on a
# GPU (the eighth session's device time ran out): benchmarks/results/run49/device_run49e.sh
# runs its native tests and times it against "jnp"; the default stays "jnp" until then.
NIBBLE_DECODE = "jnp"
NIBBLE_DECODE_CHOICES = ("jnp", "ptx")

# $0 $1: one nibble of bytes 0-3 as float16 pairs (0, 1), (2, 3); $2: the four bytes. a holds
# bytes 0 and 2's nibble at bit 0 of the two 16-bit lanes, b bytes 1 and 3's (int4: OR-ed
# into float16 1024, 0x6400, by the same lop3 that masks them: (x & mask) | 0x6400); the
# permutes pair neighbours. %(shift)d is 0 for the low nibbles, 4 for the high ones. (Two
# calls, one per nibble: JAX 0.10's Pallas lowering keeps only the first result of a
# multi-result asm.)
_INT4_PTX = """{
.reg .b32 a, b, c, d, e;
shr.b32 a, $2, %(shift)d;
lop3.b32 a, a, 0x000F000F, 0x64006400, 0xEA;
shr.b32 b, $2, %(shift_b)d;
lop3.b32 b, b, 0x000F000F, 0x64006400, 0xEA;
prmt.b32 c, a, b, 0x5410;
prmt.b32 d, a, b, 0x7632;
mov.b32 e, 0x64086408;
sub.f16x2 $0, c, e;
sub.f16x2 $1, d, e;
}"""
# nvfp4: per lane, bit 3 (sign) to bit 15 and bits 0-2 (the e2m1 magnitude) to bits 9-11, a
# float16 of e2m1 * 2**-14 (as _nibble_tile)
_NVFP4_PTX = """{
.reg .b32 a, b, c, d, e;
shr.b32 a, $2, %(shift)d;
and.b32 a, a, 0x000F000F;
shr.b32 b, $2, %(shift_b)d;
and.b32 b, b, 0x000F000F;
prmt.b32 c, a, b, 0x5410;
prmt.b32 d, a, b, 0x7632;
and.b32 e, c, 0x00080008;
shl.b32 e, e, 12;
and.b32 c, c, 0x00070007;
shl.b32 c, c, 9;
or.b32 $0, c, e;
and.b32 e, d, 0x00080008;
shl.b32 e, e, 12;
and.b32 d, d, 0x00070007;
shl.b32 d, d, 9;
or.b32 $1, d, e;
}"""


def _nibble_tiles_ptx(fmt: str, raw):
    """A uint8 tile -> (low nibbles, high nibbles) as float16 tiles, by _INT4_PTX / _NVFP4_PTX."""
    template = _INT4_PTX if fmt == "int4" else _NVFP4_PTX
    out = jax.ShapeDtypeStruct(raw.shape, jnp.float16)
    tiles = []
    for shift in (0, 4):
        asm = template % {"shift": shift, "shift_b": shift + 8}
        tiles += pltriton.elementwise_inline_asm(asm, args=[raw], constraints="=r,=r,r",
                                                 pack=4, result_shape_dtypes=[out])
    return tuple(tiles)


def packed_halves(fmt: str) -> bool:
    """Whether the multi-row kernel runs `fmt` as two half tiles (PACKED_LAYOUT "halves")."""
    if PACKED_LAYOUT not in PACKED_LAYOUT_CHOICES:
        raise ValueError(f"PACKED_LAYOUT={PACKED_LAYOUT!r}: expected one of "
                         f"{PACKED_LAYOUT_CHOICES}")
    return PACKED_LAYOUT == "halves" and fmt in PACKED_FORMATS


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
    values = _nibble_tile(fmt, _unpack_pairs(raw))
    return values * _expand_groups(scale.astype(jnp.float16), raw.shape[0])


def _nibble_tile(fmt: str, nibbles):
    """uint8 nibbles (0..15) of a tile -> float16 values, elementwise only (int4: code - 8;
    nvfp4: e2m1 times 2**-14)."""
    codes = nibbles.astype(jnp.uint16)
    if fmt == "int4":  # 1024 + u, minus 1024 + 8
        return _f16(codes | F16_ONE_THOUSAND_24) - 1032.0
    # e2m1 sign to bit 15, magnitude code to the top exponent/mantissa bits
    return _f16(((codes & 8) << 12) | ((codes & 7) << 9))


def _halves_kernel(x_ref, w_ref, scale_ref, o_ref, *, fmt: str, block_k: int, num_blocks: int,
                   ptx: bool = False):
    """int4 / nvfp4 without interleaving: the low nibbles (even columns) and the high nibbles
    (odd columns) of a byte tile are two float16 tiles, each multiplied by x on its own; the
    two [Mp, bn/2] sums go out as o_ref [2, Mp, bn/2] and XLA interleaves them once. int4
    applies its group scale to each group's dot (block_k spans whole groups, each a static
    sub-tile), so the codes' path to the tensor cores is elementwise with constants only;
    nvfp4's 16-row groups scale the tile. scale_ref is [groups, bn/2, 2]: the two columns
    of a byte side by side."""
    group = GROUP_SIZE[fmt]
    per_dot = group if fmt == "int4" else block_k

    def body(i, carry):
        acc_lo, acc_hi = carry
        k0 = pl.multiple_of(i * block_k, block_k)
        for j in range(block_k // per_dot):  # static sub-tiles (one for nvfp4)
            kj = k0 + j * per_dot
            raw = w_ref[pl.ds(kj, per_dot), :]
            x = x_ref[:, pl.ds(kj, per_dot)]
            g0 = pl.multiple_of(kj // group, per_dot // group)
            scale_lo, scale_hi = split_pairs(scale_ref[pl.ds(g0, per_dot // group), :, :])
            if ptx:
                lo, hi = _nibble_tiles_ptx(fmt, raw)
            else:
                lo, hi = _nibble_tile(fmt, raw & 0xF), _nibble_tile(fmt, raw >> 4)
            if fmt == "int4":
                acc_lo += pltriton.dot(x, lo) * scale_lo.astype(jnp.float32)
                acc_hi += pltriton.dot(x, hi) * scale_hi.astype(jnp.float32)
            else:
                acc_lo += pltriton.dot(x, lo * _expand_groups(scale_lo.astype(jnp.float16), per_dot))
                acc_hi += pltriton.dot(x, hi * _expand_groups(scale_hi.astype(jnp.float16), per_dot))
        return acc_lo, acc_hi

    _, rows, cols = o_ref.shape
    zeros = jnp.zeros((rows, cols), jnp.float32)
    acc_lo, acc_hi = lax.fori_loop(0, num_blocks, body, (zeros, zeros))
    o_ref[0] = acc_lo
    o_ref[1] = acc_hi


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
    Mp = max(MIN_DOT_ROWS, next_power_of_2(M))
    row_scale = jnp.maximum(jnp.abs(x2).max(axis=1), 1e-30) / X_RANGE  # [M]
    x16 = jnp.pad(x2 / row_scale[:, None], ((0, Mp - M), (0, Kp - K))).astype(jnp.float16)
    partial = _matmul_call(x16, w, fmt=fmt, n=N, tuning=tuning, interpret=interpret).sum(axis=0)
    if packed_halves(fmt):  # [2, Mp, N/2]: even columns, odd columns
        partial = jnp.moveaxis(partial, 0, -1).reshape(Mp, N)
    out = partial[:M] * row_scale[:, None] * _epilogue_scale(fmt, w)
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
    out_spec = pl.BlockSpec((None, Mp, bn), lambda j, s: (s, 0, j))
    out_shape = jax.ShapeDtypeStruct((NS, Mp, n), jnp.float32)
    if packed_halves(fmt):
        in_specs[2] = pl.BlockSpec((split_k // group, bn // 2, 2), lambda j, s: (s, j, 0))
        operands[2] = w["scale"].reshape(Kp // group, n // 2, 2)
        if NIBBLE_DECODE not in NIBBLE_DECODE_CHOICES:
            raise ValueError(f"NIBBLE_DECODE={NIBBLE_DECODE!r}: expected one of "
                             f"{NIBBLE_DECODE_CHOICES}")
        kernel = functools.partial(_halves_kernel, fmt=fmt, block_k=bk,
                                   num_blocks=split_k // bk,
                                   ptx=NIBBLE_DECODE == "ptx" and not interpret)
        out_spec = pl.BlockSpec((None, 2, Mp, bn // 2), lambda j, s: (s, 0, 0, j))
        out_shape = jax.ShapeDtypeStruct((NS, 2, Mp, n // 2), jnp.float32)
    return pl.pallas_call(
        kernel,
        grid=(n // bn, NS),
        in_specs=in_specs,
        out_specs=out_spec,
        out_shape=out_shape,
        compiler_params=pltriton.CompilerParams(num_warps=tuning.num_warps,
                                                num_stages=tuning.num_stages),
        interpret=interpret,
        name=f"ninfer_{fmt}_matmul",
    )(*operands)
