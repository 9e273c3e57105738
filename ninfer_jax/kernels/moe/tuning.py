"""Tile sizes for the routed-experts kernels (kernel.py), chosen per shape at trace time.

Both kernels read expert weights in place, so every tile must divide the weights exactly
(padding them would copy them) and be a power of two (Triton); when none fits, the tuning is
None and the caller takes the reference.
  expert GEMV  (few assignments, memory-bound): the grid is (assignments, column blocks, K
               splits), aiming at GEMV_TARGET_PROGRAMS programs so that enough weight bytes
               are in flight; tiles as the quantized one-row kernel measured best (float32
               partial sums of block_k x block_n values, no pipelining).
  fused MLP    (the expert GEMV's alternative, kernel.py FUSED_EXPERT_MLP): the grid is
               (assignments, width blocks), each program both products of its block.
  grouped GEMM (many assignments): the assignments sorted by expert are cut into tiles of
               block_m rows that each belong to one expert; block_m follows the mean rows per
               expert so that decode-sized groups do not pay for 64-row tiles.
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.kernels.tiling import fit_tile, next_power_of_2

GEMV_TARGET_PROGRAMS = 1056  # 8 per SM on an H200 (132 SMs)
# The fused expert MLP (kernel.py FUSED_EXPERT_MLP): programs of (assignment, width block),
# each streaming its block's gate | up columns and down rows; two per SM at least.
FUSED_TARGET_PROGRAMS = 256
FUSED_BLOCK_I = (16, 64)  # smallest and largest width block
FUSED_BLOCK_K = 128  # hidden rows per step of the first product
FUSED_BLOCK_N = 512  # down columns per step of the second
GEMV_TILE = (64, 128)  # (block_k, block_n)
MIN_BLOCKS_PER_SPLIT = 2
MIN_DOT = 16  # Triton's smallest matmul tile side
GROUPED_BLOCK_M = (16, 64)  # smallest and largest rows per grouped tile
GROUPED_BLOCK_K = 64
GROUPED_BLOCK_N = {"gate_up": 64, "down": 128}  # gate_up holds two accumulators (gate, up)


@dataclasses.dataclass(frozen=True)
class GemvTiles:
    block_k: int
    block_n: int
    num_splits: int  # programs along K; their partial sums are added by XLA
    num_warps: int = 4
    num_stages: int = 1
    # The tensor-core form (kernel.py GEMV_ON_TENSOR_CORES) for this call: None follows the
    # switch (benchmarks sweep both).
    use_dot: bool | None = None


@dataclasses.dataclass(frozen=True)
class FusedTiles:
    block_i: int  # expert width columns per program (its gate and up columns, its down rows)
    block_k: int  # hidden rows per step of the first product
    block_n: int  # hidden columns per step of the down product
    num_warps: int = 4
    num_stages: int = 2


@dataclasses.dataclass(frozen=True)
class GroupedTiles:
    block_m: int  # rows per tile (all of one expert)
    num_tiles: int  # static bound on the tiles any routing needs
    block_k: int
    block_n_gate_up: int
    block_n_down: int
    num_warps: int = 4
    num_stages: int = 3


def gemv_tiles(*, assignments: int, k: int, n: int,
               tile: tuple[int, int] = GEMV_TILE) -> GemvTiles | None:
    """Tiles for `assignments` rows, each times its own expert's [k, n] weight, from the
    largest fitting tile up to `tile` (block_k, block_n; benchmarks sweep it)."""
    block_k = fit_tile(k, tile[0], MIN_DOT)
    block_n = fit_tile(n, tile[1], MIN_DOT)
    if block_k is None or block_n is None:
        return None
    num_blocks = k // block_k
    wanted = max(1, -(-GEMV_TARGET_PROGRAMS // (assignments * (n // block_n))))
    limit = max(1, num_blocks // MIN_BLOCKS_PER_SPLIT)
    splits = max(d for d in range(1, min(wanted, limit) + 1) if num_blocks % d == 0)
    return GemvTiles(block_k=block_k, block_n=block_n, num_splits=splits)


def fused_tiles(*, assignments: int, hidden: int, width: int) -> FusedTiles | None:
    """Tiles for the fused expert MLP of `assignments` rows through experts of hidden x width:
    the widest block_i in FUSED_BLOCK_I that still gives FUSED_TARGET_PROGRAMS programs (the
    narrowest that divides the width otherwise); None when nothing divides."""
    smallest, largest = FUSED_BLOCK_I
    block_k = fit_tile(hidden, FUSED_BLOCK_K, MIN_DOT)
    block_n = fit_tile(hidden, FUSED_BLOCK_N, MIN_DOT)
    block_i = None
    candidate = largest
    while candidate >= smallest:
        if width % candidate == 0:
            block_i = candidate
            if assignments * (width // candidate) >= FUSED_TARGET_PROGRAMS:
                break
        candidate //= 2
    if None in (block_k, block_n, block_i):
        return None
    return FusedTiles(block_i=block_i, block_k=block_k, block_n=block_n)


def grouped_tiles(*, assignments: int, experts: int, hidden: int,
                  width: int) -> GroupedTiles | None:
    """Tiles for `assignments` (token, expert) rows through experts of hidden x width."""
    smallest, largest = GROUPED_BLOCK_M
    block_m = min(largest, max(smallest, next_power_of_2(-(-assignments // experts))))
    block_k_up = fit_tile(hidden, GROUPED_BLOCK_K, MIN_DOT)
    block_k_down = fit_tile(width, GROUPED_BLOCK_K, MIN_DOT)
    block_n_up = fit_tile(width, GROUPED_BLOCK_N["gate_up"], MIN_DOT)
    block_n_down = fit_tile(hidden, GROUPED_BLOCK_N["down"], MIN_DOT)
    if None in (block_k_up, block_k_down, block_n_up, block_n_down):
        return None
    # Each expert's rows round up to whole tiles: at most one partial tile per used expert.
    num_tiles = -(-assignments // block_m) + min(experts, assignments)
    return GroupedTiles(block_m=block_m, num_tiles=num_tiles,
                        block_k=min(block_k_up, block_k_down), block_n_gate_up=block_n_up,
                        block_n_down=block_n_down)
