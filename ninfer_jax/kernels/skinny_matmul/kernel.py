"""x [M, K] @ w [K, N] for M <= 16 as a split-K Pallas (Triton) kernel, same contract as
reference.py.

One program per (column block, K split) walks its split's K blocks: the rows of x padded to
16 (Triton's smallest dot tile) by a masked load, the weight tile as stored, one tensor-core
dot each, float32 sums; the splits' sums are stored for the M real rows only and added by one
XLA fusion that also rounds them (none with one split: the program rounds and stores).
Tested in interpret mode on CPU.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ninfer_jax.kernels.tiling import fit_tile

DOT_ROWS = 16
TARGET_PROGRAMS = 264  # two per SM on an H100 / H200 (132 SMs): each streams with its stages
MIN_BLOCKS_PER_SPLIT = 4


@dataclasses.dataclass(frozen=True)
class SkinnyTiles:
    block_k: int
    block_n: int
    num_splits: int
    num_warps: int = 4
    num_stages: int = 4


def skinny_tiles(*, k: int, n: int, block_k: int = 128, block_n: int = 128,
                 num_warps: int = 4, num_stages: int = 4,
                 target_programs: int = TARGET_PROGRAMS) -> SkinnyTiles | None:
    """Tiles dividing [k, n] (powers of two up to the given ones), with K splits enough for
    `target_programs`; None when none fit."""
    bk, bn = fit_tile(k, block_k, 16), fit_tile(n, block_n, 16)
    if bk is None or bn is None:
        return None
    blocks = k // bk
    wanted = max(1, -(-target_programs // (n // bn)))
    limit = max(1, blocks // MIN_BLOCKS_PER_SPLIT)
    splits = max(d for d in range(1, min(wanted, limit) + 1) if blocks % d == 0)
    return SkinnyTiles(block_k=bk, block_n=bn, num_splits=splits, num_warps=num_warps,
                       num_stages=num_stages)


def skinny_matmul(x, w, *, swiglu: bool = False, tiles: SkinnyTiles | None = None,
                  interpret: bool = False):
    """See reference.skinny_matmul; None when M > 16, the dtypes differ or nothing tiles.
    swiglu: each program computes its rows' silu(gate) * up for its K blocks as it loads
    them (the gated MLP's activation without a kernel of its own)."""
    M, K, N = x.shape[0], x.shape[1] // (2 if swiglu else 1), w.shape[1]
    if M > DOT_ROWS or w.shape[0] != K or x.dtype != w.dtype or (swiglu and x.shape[1] % 2):
        return None
    tiles = tiles or skinny_tiles(k=K, n=N)
    if tiles is None:
        return None
    NS, bk, bn = tiles.num_splits, tiles.block_k, tiles.block_n
    out_dtype = x.dtype if NS == 1 else jnp.float32
    whole = lambda a: pl.BlockSpec(a.shape, lambda *_: (0,) * a.ndim)  # noqa: E731
    out = jax.ShapeDtypeStruct((NS, M, N), out_dtype)
    kernel = functools.partial(_skinny_kernel, block_k=bk, num_blocks=K // bk // NS,
                               up_at=K if swiglu else None)
    sums = pl.pallas_call(
        kernel,
        grid=(N // bn, NS),
        in_specs=[whole(x), pl.BlockSpec((K // NS, bn), lambda j, s: (s, j))],
        out_specs=whole(out),
        out_shape=out,
        compiler_params=pltriton.CompilerParams(num_warps=tiles.num_warps,
                                                num_stages=tiles.num_stages),
        interpret=interpret,
        name="ninfer_skinny_matmul",
    )(x, w)
    return sums[0] if NS == 1 else sums.sum(axis=0).astype(x.dtype)


def _skinny_kernel(x_ref, w_ref, o_ref, *, block_k: int, num_blocks: int,
                   up_at: int | None):
    """One (column block, K split) program: o_ref [NS, M, N] whole, of which it stores its
    split's [M, bn] sums; w_ref is the split's [K / NS, bn] slab. up_at: x_ref holds gate | up
    with up from this column, and the left operand is silu(gate) * up."""
    column, split = pl.program_id(0), pl.program_id(1)
    M = x_ref.shape[0]
    block_n = w_ref.shape[1]
    first_k = split * num_blocks * block_k
    rows = lax.broadcasted_iota(jnp.int32, (DOT_ROWS, block_k), 0)

    def body(i, acc):
        k0 = pl.multiple_of(i * block_k, block_k)
        def rows_at(column):
            return pltriton.load(x_ref.at[pl.ds(0, DOT_ROWS), pl.ds(column, block_k)],
                                 mask=rows < M, other=0.0)

        x = rows_at(first_k + k0)
        if up_at is not None:
            gate = x.astype(jnp.float32)
            up = rows_at(up_at + first_k + k0).astype(jnp.float32)
            x = (gate * jax.nn.sigmoid(gate) * up).astype(x_ref.dtype)
        return acc + pltriton.dot(x, w_ref[pl.ds(k0, block_k), :])

    acc = lax.fori_loop(0, num_blocks, body, jnp.zeros((DOT_ROWS, block_n), jnp.float32))
    stored = lax.broadcasted_iota(jnp.int32, (DOT_ROWS, block_n), 0) < M
    columns = pl.ds(pl.multiple_of(column * block_n, block_n), block_n)
    pltriton.store(o_ref.at[split, pl.ds(0, DOT_ROWS), columns], acc.astype(o_ref.dtype),
                   mask=stored)
