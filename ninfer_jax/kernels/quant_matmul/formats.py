"""Weight formats for projections: quantize on the host (numpy), describe a stored leaf.

A projection weight is stored [K, N] (in, out) so a matmul is `x @ w`. In the params pytree a
bf16 weight is a plain array; a quantized weight is a dict whose one non-scale key names the
format (so `format_of` needs no side channel and orbax stores it as an ordinary subtree):

    int8   {"int8":  int8 [K, N],             "scale": f32 [N]}            w = q * scale[n]
    fp8    {"fp8":   float8_e4m3fn [K, N],    "scale": f32 [N]}            w = q * scale[n]
    int4   {"int4":  uint8 [Kp, N/2],         "scale": f16 [Kp/128, N]}    w = (u - 8) * scale
    nvfp4  {"nvfp4": uint8 [Kp, N/2],         "scale": float8_e4m3fn [Kp/16, N],
            "global_scale": f32 []}                                         w = e2m1(u) * scale * g

4-bit codes pack two neighbouring OUTPUT columns per byte: the low nibble holds column 2j, the
high nibble column 2j+1 (the order XLA uses for int4 arrays). int4 codes are offset by 8
(u in 0..15 means q = u - 8); nvfp4 codes are e2m1 (bit 3 sign, bits 0-2 magnitude code, values
0, 0.5, 1, 1.5, 2, 3, 4, 6). Group-scaled formats pad K with zero rows to a multiple of their
group (Kp >= K); the matmul reads only the first K rows' worth of x.

GGUF block formats are kept exactly as llama.cpp stores them (no f32 expansion): one row of
K/32 blocks per OUTPUT column, as raw bytes (ggml's [N, K] tensor layout, transposed from ours):

    q8_0   {"q8_0": uint8 [N, K/32 * 34]}   block: f16 d, int8 q[32]            w = d * q
    q4_0   {"q4_0": uint8 [N, K/32 * 18]}   block: f16 d, u8 qs[16]             w = d * (u - 8)
    q4_1   {"q4_1": uint8 [N, K/32 * 20]}   block: f16 d, f16 m, u8 qs[16]      w = d * u + m

where the block's element j < 16 is the low nibble of qs[j] and element j + 16 its high nibble.
The leaf still stands for a [K, N] weight; a tied embedding table [V, H] in a block format is
the same leaf as its [H, V] output projection (rows of blocks are the table's rows).

On the CPU the load regroups a block leaf for the C++ kernel (never stored in an artifact):

    q8_0x16, q4_0x16, q4_1x16   uint8 [N/16, K/32 * 16 * block bytes]

the same bytes, per group of 16 output columns and per block one record: the 16 columns' d,
(q4_1) their 16 m, then the codes in 4-byte groups, group j holding bytes 4j..4j+3 of qs (or
q) of each column in turn (`interleave_order`; ggml_matmul.cc says why).

With W8A8 on for every row count (kernels/quant_matmul/__init__.py, W8A8_MIN_ROWS) the load
transposes the per-channel leaves for the 8-bit GEMM, which wants both operands contiguous
along K (never stored in an artifact either):

    int8_nk  {"int8_nk": int8 [N, K],          "scale": f32 [N]}            w = q.T * scale[n]
    fp8_nk   {"fp8_nk":  float8_e4m3fn [N, K], "scale": f32 [N]}
"""
from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

BLOCK_FORMATS = ("q8_0", "q4_0", "q4_1")
FORMATS = ("bf16", "int8", "fp8", "int4", "nvfp4") + BLOCK_FORMATS
QUANTIZED_FORMATS = FORMATS[1:]
BLOCK_SIZE = 32  # weights per GGUF block
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}
INT4_GROUP = 128
NVFP4_GROUP = 16
INT4_OFFSET = 8
FP8_MAX = 448.0  # largest finite float8_e4m3fn
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
_E2M1_MIDPOINTS = (E2M1_VALUES[1:] + E2M1_VALUES[:-1]) / 2
_TINY = 1e-12  # floor for scales of all-zero columns or groups
INTERLEAVE = 16  # output columns per group of the CPU kernel's load-time layout
INTERLEAVED_FORMATS = {f"{fmt}x{INTERLEAVE}": fmt for fmt in BLOCK_FORMATS}
PER_CHANNEL_FORMATS = ("int8", "fp8")
TRANSPOSED_FORMATS = {f"{fmt}_nk": fmt for fmt in PER_CHANNEL_FORMATS}
# every key that names a leaf's format: stored formats and the load-only layouts
LEAF_FORMATS = QUANTIZED_FORMATS + tuple(INTERLEAVED_FORMATS) + tuple(TRANSPOSED_FORMATS)


def format_of(leaf) -> str:
    """The format name of a weight leaf (a plain array is bf16, or whatever float it holds)."""
    if not isinstance(leaf, dict):
        return "bf16"
    names = [k for k in leaf if k not in ("scale", "global_scale")]
    if len(names) != 1 or names[0] not in LEAF_FORMATS:
        raise ValueError(f"not a quantized weight leaf: keys {sorted(leaf)}")
    return names[0]


def logical_shape(leaf) -> tuple[int, int]:
    """(K rows as stored incl. group padding, N) of a weight leaf."""
    fmt = format_of(leaf)
    if fmt == "bf16":
        return tuple(leaf.shape)
    codes = leaf[fmt]
    if fmt in BLOCK_FORMATS:
        return codes.shape[1] // BLOCK_BYTES[fmt] * BLOCK_SIZE, codes.shape[0]
    if fmt in TRANSPOSED_FORMATS:
        return codes.shape[1], codes.shape[0]
    if fmt in INTERLEAVED_FORMATS:
        record = INTERLEAVE * BLOCK_BYTES[INTERLEAVED_FORMATS[fmt]]
        return codes.shape[1] // record * BLOCK_SIZE, codes.shape[0] * INTERLEAVE
    cols = codes.shape[1] * (2 if fmt in ("int4", "nvfp4") else 1)
    return codes.shape[0], cols


def stored_bytes(leaf) -> int:
    """Bytes the leaf occupies (what a memory-bound matmul must read)."""
    if not isinstance(leaf, dict):
        return int(leaf.size * leaf.dtype.itemsize)
    return sum(int(a.size * a.dtype.itemsize) for a in leaf.values())


def describe(leaf) -> str:
    """One line for inspect-artifact: format, logical shape, stored bytes."""
    rows, cols = logical_shape(leaf)
    return f"{format_of(leaf)} [{rows}, {cols}] {stored_bytes(leaf)} bytes"


def quantize(w, fmt: str):
    """Quantize a float weight [K, N] (numpy) into `fmt`'s leaf (see module docstring)."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"weights must be 2-D [in, out], got shape {w.shape}")
    if fmt == "bf16":
        return w.astype(ml_dtypes.bfloat16)
    if fmt in BLOCK_FORMATS:
        return _gguf_blocks(w, fmt)
    if fmt in ("int4", "nvfp4") and w.shape[1] % 2:
        raise ValueError(f"{fmt} packs column pairs: N must be even, got {w.shape[1]}")
    try:
        return _QUANTIZERS[fmt](w)
    except KeyError:
        raise ValueError(f"unknown weight format {fmt!r}; expected one of {FORMATS}") from None


def _per_channel_int8(w):
    scale = np.maximum(np.abs(w).max(axis=0), _TINY) / 127.0
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return {"int8": q, "scale": scale.astype(np.float32)}


def _per_channel_fp8(w):
    scale = np.maximum(np.abs(w).max(axis=0), _TINY) / FP8_MAX
    q = np.clip(w / scale, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    return {"fp8": q, "scale": scale.astype(np.float32)}


def _pad_rows(w, group: int):
    pad = -w.shape[0] % group
    return np.pad(w, ((0, pad), (0, 0))) if pad else w


def pack_nibbles(codes):
    """uint8 codes [K, N] in 0..15 -> bytes [K, N/2] (column 2j low, 2j+1 high)."""
    codes = codes.astype(np.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_nibbles(packed):
    """Inverse of pack_nibbles (numpy)."""
    out = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
    out[:, 0::2], out[:, 1::2] = packed & 0xF, packed >> 4
    return out


def _grouped_int4(w):
    w = _pad_rows(w, INT4_GROUP)
    groups = w.reshape(-1, INT4_GROUP, w.shape[1])
    scale = np.maximum(np.abs(groups).max(axis=1), _TINY) / 7.0  # [Kp/128, N]
    scale = scale.astype(np.float16).astype(np.float32)  # quantize against the stored scale
    q = np.clip(np.rint(groups / scale[:, None, :]), -8, 7).reshape(w.shape)
    return {"int4": pack_nibbles(q + INT4_OFFSET), "scale": scale.astype(np.float16)}


def _nvfp4(w):
    w = _pad_rows(w, NVFP4_GROUP)
    groups = w.reshape(-1, NVFP4_GROUP, w.shape[1])
    # The global scale maps the largest block scale to the top of the fp8 range.
    global_scale = max(float(np.abs(w).max()), _TINY) / (E2M1_VALUES[-1] * FP8_MAX)
    block = np.abs(groups).max(axis=1) / E2M1_VALUES[-1] / global_scale  # [Kp/16, N]
    block = np.clip(block, 0, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    step = block.astype(np.float32) * global_scale
    scaled = groups / np.where(step > 0, step, 1.0)[:, None, :]
    magnitude = np.searchsorted(_E2M1_MIDPOINTS, np.abs(scaled)).astype(np.uint8)
    codes = magnitude | np.where(scaled < 0, 8, 0).astype(np.uint8)
    return {"nvfp4": pack_nibbles(codes.reshape(w.shape)), "scale": block,
            "global_scale": np.asarray(global_scale, np.float32)}


def _gguf_blocks(w, fmt):
    """[K, N] floats -> the GGUF block leaf (gguf's own quantizer, as llama.cpp's converters)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize as gguf_quantize

    if w.shape[0] % BLOCK_SIZE:
        raise ValueError(f"{fmt} needs K a multiple of {BLOCK_SIZE}, got {w.shape[0]}")
    kind = GGMLQuantizationType[fmt.upper()]
    return {fmt: np.ascontiguousarray(gguf_quantize(np.ascontiguousarray(w.T), kind))}


@functools.lru_cache(maxsize=32)
def interleave_order(fmt: str, nb: int) -> np.ndarray:
    """For a block format and K/32 blocks: the interleaved group's bytes [16 * nb * bb] as
    indices into its 16 columns' block rows laid end to end ([16, nb * bb] flattened)."""
    bb = BLOCK_BYTES[fmt]
    qs_at = 4 if fmt == "q4_1" else 2
    code_groups = (bb - qs_at) // 4
    column = np.arange(INTERLEAVE)[:, None] * (nb * bb)  # [16, 1]
    records = []
    for b in range(nb):
        at = column + b * bb
        parts = [(at + np.arange(2)).ravel()]  # d of each column
        if fmt == "q4_1":
            parts.append((at + 2 + np.arange(2)).ravel())  # m of each column
        codes = at[None] + qs_at + 4 * np.arange(code_groups)[:, None, None] + np.arange(4)
        parts.append(codes.ravel())  # [group j, column, byte]
        records.append(np.concatenate(parts))
    return np.concatenate(records)


def interleave_blocks(raw, fmt: str) -> np.ndarray:
    """Block bytes [N, nb * bb] (N a multiple of 16) -> the interleaved [N/16, 16 * nb * bb]."""
    raw = np.asarray(raw, np.uint8)
    N, row = raw.shape
    if N % INTERLEAVE:
        raise ValueError(f"interleaving needs N a multiple of {INTERLEAVE}, got {N}")
    order = interleave_order(fmt, row // BLOCK_BYTES[fmt])
    return np.ascontiguousarray(raw.reshape(N // INTERLEAVE, INTERLEAVE * row)[:, order])


@functools.lru_cache(maxsize=32)
def deinterleave_order(fmt: str, nb: int) -> np.ndarray:
    """interleave_order's inverse: for each column's block bytes ([16, nb * bb] flattened) its
    index in the interleaved group."""
    order = interleave_order(fmt, nb)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    return inverse


def block_leaf(fmt: str, blocks) -> dict:
    """A leaf of GGUF block bytes [N, K/32 * block bytes] as read from a GGUF file."""
    return {fmt: np.ascontiguousarray(np.asarray(blocks, np.uint8))}


_QUANTIZERS = {"int8": _per_channel_int8, "fp8": _per_channel_fp8, "int4": _grouped_int4,
               "nvfp4": _nvfp4}


def dequantize_numpy(leaf) -> np.ndarray:
    """Float32 [Kp, N] weights a leaf stands for (host-side check of the formats)."""
    fmt = format_of(leaf)
    if fmt == "bf16":
        return np.asarray(leaf, np.float32)
    if fmt in ("int8", "fp8"):
        return leaf[fmt].astype(np.float32) * leaf["scale"].astype(np.float32)[None, :]
    if fmt in TRANSPOSED_FORMATS:
        return dequantize_numpy({TRANSPOSED_FORMATS[fmt]: np.asarray(leaf[fmt]).T,
                                 "scale": leaf["scale"]})
    if fmt in INTERLEAVED_FORMATS:
        base = INTERLEAVED_FORMATS[fmt]
        raw = np.asarray(leaf[fmt])
        nb = raw.shape[1] // (INTERLEAVE * BLOCK_BYTES[base])
        rows = raw[:, deinterleave_order(base, nb)].reshape(-1, nb * BLOCK_BYTES[base])
        return dequantize_numpy({base: rows})
    if fmt in BLOCK_FORMATS:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize as gguf_dequantize
        return np.asarray(gguf_dequantize(np.asarray(leaf[fmt]),
                                          GGMLQuantizationType[fmt.upper()]), np.float32).T
    codes = unpack_nibbles(np.asarray(leaf[fmt]))
    if fmt == "int4":
        values, group = codes.astype(np.float32) - INT4_OFFSET, INT4_GROUP
        scale = leaf["scale"].astype(np.float32)
    else:
        values, group = _e2m1_numpy(codes), NVFP4_GROUP
        scale = leaf["scale"].astype(np.float32) * float(leaf["global_scale"])
    return values * np.repeat(scale, group, axis=0)


def _e2m1_numpy(codes):
    magnitude = E2M1_VALUES[codes & 7]
    return np.where(codes & 8, -magnitude, magnitude)
