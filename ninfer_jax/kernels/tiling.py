"""Tile sizes shared by the Triton-lowered kernels (quant_matmul, moe, paged_attention, norms,
attention_prologue, skinny_matmul, mamba2, gated_delta).

A tile must be a power of two (Triton) and divide the weight's side exactly: the kernels read
weights in place and never pad them (padding would copy them).
"""
from __future__ import annotations


def fit_tile(size: int, preferred: int, smallest: int) -> int | None:
    """The largest power of two in [smallest, preferred] that divides size, or None."""
    tile = preferred
    while tile >= smallest:
        if size % tile == 0:
            return tile
        tile //= 2
    return None


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): Triton's tile sides."""
    return 1 << max(0, n - 1).bit_length()


def is_power_of_2(n: int) -> bool:
    """Whether n is a power of two (a side Triton can tile without masks)."""
    return n > 0 and n & (n - 1) == 0
