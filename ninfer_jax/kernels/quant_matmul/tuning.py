"""Tile sizes for the quantized decode matmul, chosen per (M, K, N, format) at trace time.

The kernel is memory-bound: the grid is (column blocks, K splits) and we aim for a few programs
per SM so that enough packed weight bytes are in flight. Every tile must be a power of two
(Triton), the K tile must hold whole scale groups, and the tiles must divide the weight exactly
(the kernel never pads weights: that would copy them). When no tiling fits, `matmul_tuning`
returns None and the caller uses the XLA reference.
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.kernels.tiling import fit_tile

TARGET_PROGRAMS = 528  # 4 per SM on an H200 (132 SMs)
GEMV_TARGET_PROGRAMS = 1056  # the one-row kernel has less in flight per program
# One-row kernel tiles per format (block_k, block_n): float32 partial sums of 8192 values.
GEMV_TILES = {"int8": (64, 128), "fp8": (64, 128), "int4": (128, 64), "nvfp4": (64, 128)}
MIN_BLOCKS_PER_SPLIT = 2  # keep at least two K tiles per program so the loop can pipeline
GROUP_SIZE = {"int8": 1, "fp8": 1, "int4": 128, "nvfp4": 16}
# Formats whose single row (batch-1 decode) goes to the tensor-core kernel (x padded to 16
# rows) instead of the one-row FMA kernel, read while tracing: the FMA kernel spends several
# float32 instructions per weight, which for 4-bit codes costs more than the bytes saved
# (docs/benchmarks.md, runs 3-4); the tensor-core kernel decodes two codes per float16x2
# instruction and wastes only idle tensor-core time on the padding rows. Run 49 (H200, 4096 x
# 14336): int4 37.7 us against the FMA kernel's 53.8, fp8 36.1 against 50.3, nvfp4 49.5
# against 52.6; int8 keeps the FMA kernel (31.0 against 39.2).
ONE_ROW_DOT_FORMATS: frozenset = frozenset({"int4", "nvfp4", "fp8"})


SHARED_MEMORY_BUDGET = 160 * 1024  # bytes of pipeline buffers we allow (H200: 227 KiB/block)


@dataclasses.dataclass(frozen=True)
class MatmulTuning:
    block_n: int  # output columns per program
    block_k: int  # K rows per loop iteration
    num_splits: int  # programs along K (partial sums added by XLA)
    num_warps: int = 4
    num_stages: int = 4
    use_dot: bool = True  # tensor-core tiles; False = the one-row FMA kernel (gemv.py)


def _stages_thatfit_tile(stages: int, rows: int, block_k: int, block_n: int, fmt: str) -> int:
    """Fewer pipeline stages when x tile + weight tile per stage would overflow shared memory
    (the dequantized float16 tile handed to the tensor cores needs room too)."""
    padded_rows = max(16, 1 << max(0, rows - 1).bit_length())
    weight_bytes = block_k * block_n // (2 if fmt in ("int4", "nvfp4") else 1)
    per_stage = padded_rows * block_k * 2 + weight_bytes
    room = SHARED_MEMORY_BUDGET - block_k * block_n * 2
    return max(1, min(stages, room // per_stage))


def matmul_tuning(*, rows: int, k: int, n: int, fmt: str, block_n: int | None = None,
                  block_k: int | None = None, num_splits: int | None = None,
                  num_warps: int = 4, num_stages: int | None = None,
                  use_dot: bool | None = None) -> MatmulTuning | None:
    """Tiles for x [rows, k] @ w [k, n] in `fmt`, or None when the shape does not tile."""
    group = GROUP_SIZE[fmt]
    use_dot = rows > 1 or (fmt in ONE_ROW_DOT_FORMATS if use_dot is None else use_dot)
    preferred_k, preferred_n = (256, 128) if use_dot else GEMV_TILES[fmt]
    block_k = block_k or fit_tile(k, preferred_k, max(group, 16))
    block_n = block_n or fit_tile(n, preferred_n, 32)
    if block_n is None or block_k is None or n % block_n or k % block_k or block_k % group:
        return None
    if use_dot:
        num_stages = num_stages or 4
        while (_stages_thatfit_tile(num_stages, rows, block_k, block_n, fmt) < 3
               and block_k // 2 >= max(group, 32)):
            block_k //= 2  # more rows of x per stage: trade K depth for pipeline stages
        num_stages = _stages_thatfit_tile(num_stages, rows, block_k, block_n, fmt)
    else:
        num_stages = num_stages or 1  # measured: pipelining one-row loads costs occupancy
    num_blocks = k // block_k
    if num_splits is None:
        target = TARGET_PROGRAMS if use_dot else GEMV_TARGET_PROGRAMS
        wanted = max(1, -(-target // (n // block_n)))
        limit = max(1, num_blocks // MIN_BLOCKS_PER_SPLIT)
        num_splits = max(d for d in range(1, min(wanted, limit) + 1) if num_blocks % d == 0)
    if num_blocks % num_splits:
        return None
    return MatmulTuning(block_n=block_n, block_k=block_k, num_splits=num_splits,
                        num_warps=num_warps, num_stages=num_stages, use_dot=use_dot)
