"""Routed MoE experts as Pallas kernels (GPU), same contract as reference.py.

Why: on NVIDIA GPUs XLA rewrites `ragged_dot` into a dense dot over a group-masked copy of
the rows broadcast to every expert (RaggedDotRewriter: E times the FLOPs and an [rows, E, H]
temporary, 256x for Qwen3.6-35B-A3B), and the reference's decode path gathers the selected
experts' weights into a new array before multiplying (read, write, read again). Both kernels
here read each selected expert's weights in place, once per tile.

Lowering: Pallas' Triton backend (as kernels/paged_attention and quant_matmul), tested in
interpret mode on CPU. Two paths, picked while tracing from the static shapes:
  expert GEMV   fewer (token, expert) assignments than experts (decode): one program per
                (assignment, column block, K split) streams its expert's weight tile with
                float32 FMAs (no tensor cores: one row would leave them idle). Between the
                two GEMVs the gate/up GEMV's K splits are added and the activation applied
                (ACTIVATION_AT says where); one XLA fusion adds the down GEMV's splits with
                the combine weights.
                Assignments of combine weight zero (padding rows, model/moe_mlp.py; experts
                of another device under expert parallelism) run no loop iterations.
                FUSED_EXPERT_MLP replaces the two GEMVs by one kernel: one program per
                (assignment, block of the expert's width) runs both products of its block.
  grouped GEMM  otherwise (prefill, large batches): assignments sorted by expert are laid
                out in `num_tiles` tiles of block_m rows, each tile one expert's (its rows
                past the expert's count are padding); the gate/up kernel gathers its tokens'
                rows of x, multiplies on the tensor cores and applies SwiGLU in registers; the
                down kernel reads those tiles as they are. Tiles past the routing's need run
                no loop iterations. Assignments of combine weight zero get no row in any
                tile. XLA gathers each assignment's row back and combines.
Experts without a gate (activation "relu2", Nemotron-H) take the same paths: the GEMV's
first product is the up columns only (the down GEMV squares the ReLU of their sum as it
reads them), and the grouped path's first kernel (_up_relu2_kernel) accumulates one product
and squares its ReLU in registers.
Layout of the grouped path: padded row of sorted assignment p of expert e =
tile_start[e] * block_m + (p - start[e]); `position[a]` is that row for assignment a.
Shape letters: N tokens, k experts per token, A = N*k assignments, E experts, H hidden,
I expert width, T tiles, M = T * block_m padded rows.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ninfer_jax.kernels import dispatch
from ninfer_jax.kernels.moe.reference import activate
from ninfer_jax.kernels.moe.tuning import (FusedTiles, GemvTiles, GroupedTiles, fused_tiles,
                                           gemv_tiles, grouped_tiles)

# Where the expert GEMV path adds the gate/up GEMV's K splits and applies the activation,
# read while tracing (a benchmark may set it before it jits): "fusion", one XLA fusion
# between the two kernels, so the down GEMV reads [A, I] activations in x's dtype; "down",
# inside the down GEMV, whose every program re-reads and adds the splits of its K range
# (one launch fewer, but run 48c's profile of the 35B-A3B's one-row step had that down GEMV
# at 61 us a layer for 16 MB of weights, against 19 us for the gate/up GEMV's 32 MB).
ACTIVATION_AT = "fusion"
# Whether the expert GEMV multiplies on the tensor cores: the assignment's row padded to
# DOT_ROWS rows (the others zero) times its expert's bfloat16 / float16 tile, where the FMA
# loop widens every weight to float32 and ends each program with a [block_k, block_n]
# cross-thread sum. Run 57's profile: the FMA GEMVs at ~2 TB/s, 1.09 ms of the 35B-A3B's
# 3.64 ms 2-row step on an H100. Off until a GPU measures it; NINFER_MOE_GEMV_DOT ("1" / "0")
# overrides it while tracing.
GEMV_ON_TENSOR_CORES = False
GEMV_DOT_ENV = "NINFER_MOE_GEMV_DOT"
DOT_ROWS = 16  # Triton's smallest matmul tile side
# Whether the decode path runs each assignment's whole expert MLP in one kernel: one program
# per (assignment, block of the expert's width) computes its block's gate and up sums over
# the hidden size, the activation in registers, and that block's share of the down product
# [H], so the activation fusion and the second launch go (run 57: the two GEMVs 17.6 + 9.7 us
# a layer for ~50 MB, ~2 TB/s on an H100; the activation fusion between them ~1 us). The
# shares of the blocks are added with the combine weights by the usual XLA fusion. Off: its
# native tests pass, but run 64b (H100, the 35B-A3B at one unpadded row) was slower with it,
# 188.6 against 217.8 tok/s (width blocks of 16: each program's gate | up tile is [128, 16],
# 32-byte rows); NINFER_MOE_FUSED_MLP ("1" / "0") overrides it while tracing.
FUSED_EXPERT_MLP = False
FUSED_MLP_ENV = "NINFER_MOE_FUSED_MLP"


def routed_experts(x, expert_ids, expert_weights, gate_up, down, *, activation: str = "swiglu",
                   interpret: bool = False):
    """x [N, H], expert_ids int32 [N, k], expert_weights [N, k], gate_up [E, H, 2I] (or
    [E, H, I] for "relu2"), down [E, I, H] -> [N, H] in x's dtype; None when the shapes do
    not tile."""
    num_assignments = expert_ids.shape[0] * expert_ids.shape[1]
    path = gathered_experts if num_assignments < gate_up.shape[0] else grouped_experts
    return path(x, expert_ids, expert_weights, gate_up, down, activation=activation,
                interpret=interpret)


def _combine(per_assignment, expert_weights, dtype):
    """[A, H] float32 rows in (token, k) order -> [N, H], weighted by the router. A multiply
    and a sum over k, which XLA fuses with what produced the rows (a dot would be a kernel
    of its own)."""
    N, top_k = expert_weights.shape
    rows = per_assignment.reshape(N, top_k, -1)
    weighted = rows * expert_weights.astype(jnp.float32)[:, :, None]
    return weighted.sum(axis=1).astype(dtype)


# ---------------------------------------------------------------------------- expert GEMV

def gathered_experts(x, expert_ids, expert_weights, gate_up, down, *, activation="swiglu",
                     interpret=False, tiles: tuple[GemvTiles, GemvTiles] | None = None):
    """The decode path: each assignment's row times its expert's weights, read in place.
    The first GEMV (K-split partial sums), their sum and the activation (ACTIVATION_AT), the
    down GEMV, and one XLA fusion adding its partial sums with the combine weights. `tiles`
    (the gate/up GEMV's, the down GEMV's) replaces the tuning's choice (benchmarks)."""
    N, top_k = expert_ids.shape
    A, (_, H, first) = N * top_k, gate_up.shape
    width = down.shape[1]
    if tiles is None and dispatch.switch(FUSED_MLP_ENV, FUSED_EXPERT_MLP):
        fused = fused_tiles(assignments=A, hidden=H, width=width)
        if fused is not None:
            shares = _fused_expert_mlp(x, expert_ids.reshape(A).astype(jnp.int32),
                                       expert_weights.reshape(A), gate_up, down,
                                       rows_per_input=top_k, tiles=fused,
                                       activation=activation, interpret=interpret)
            return _combine(shares.sum(axis=0), expert_weights, x.dtype)
    up_tiles, down_tiles = tiles or (gemv_tiles(assignments=A, k=H, n=first),
                                     gemv_tiles(assignments=A, k=width, n=H))
    if up_tiles is None or down_tiles is None:
        return None
    ids = expert_ids.reshape(A).astype(jnp.int32)
    # Zero-weight assignments (padding rows, experts of another device) add nothing: their
    # programs read no weights and write zeros. The programs test the weights themselves (a
    # `used` mask computed beforehand was a kernel of its own per MoE layer).
    used = expert_weights.reshape(A)
    hidden = _expert_gemv(x, ids, used, gate_up, rows_per_input=top_k, tiles=up_tiles,
                          interpret=interpret)  # [NS, A, 2I] (relu2: [NS, A, I]) partial sums
    if ACTIVATION_AT == "fusion":
        act = activate(hidden.sum(axis=0), activation).astype(x.dtype)  # [A, I]
        out = _expert_gemv(act, ids, used, down, rows_per_input=1, tiles=down_tiles,
                           interpret=interpret)  # [NS', A, H]
    elif ACTIVATION_AT == "down":
        out = _expert_gemv(hidden, ids, used, down, rows_per_input=1, tiles=down_tiles,
                           activation=activation, act_dtype=x.dtype, interpret=interpret)
    else:
        raise ValueError(f"ACTIVATION_AT={ACTIVATION_AT!r}: expected 'fusion' or 'down'")
    return _combine(out.sum(axis=0), expert_weights, x.dtype)


def gemv_on_tensor_cores(weight_dtype) -> bool:
    """The switch (GEMV_ON_TENSOR_CORES, NINFER_MOE_GEMV_DOT overriding it), for 16-bit
    weights only: float32 operands would run as TF32 on the tensor cores."""
    return (dispatch.switch(GEMV_DOT_ENV, GEMV_ON_TENSOR_CORES)
            and jnp.dtype(weight_dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)))


def _gemv_kernel(id_ref, used_ref, x_ref, w_ref, o_ref, *, rows_per_input: int, block_k: int,
                 num_blocks: int, activation, act_dtype, use_dot: bool = False):
    """One (assignment, column block, K split) program: o_ref [bn] partial sums (zeros for an
    unused assignment). With `act_dtype`, x_ref holds the first GEMV's partial sums
    [NS, A, 2I] (relu2: [NS, A, I]): the input row is the activation of their sum, rounded to
    that dtype (as the reference rounds the activation before the down product)."""
    assignment, column, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    expert = id_ref[0]
    row = assignment // rows_per_input
    block_n = o_ref.shape[0]
    first_col = pl.multiple_of(column * block_n, block_n)
    first_k = split * (num_blocks * block_k)

    def inputs(k0):
        if act_dtype is None:
            return x_ref[row, pl.ds(k0, block_k)].astype(jnp.float32)
        if activation == "relu2":
            up = x_ref[0, row, pl.ds(k0, block_k)]
            for part in range(1, x_ref.shape[0]):
                up += x_ref[part, row, pl.ds(k0, block_k)]
            return jnp.square(jnp.maximum(up, 0.0)).astype(act_dtype).astype(jnp.float32)
        width = x_ref.shape[2] // 2
        gate = x_ref[0, row, pl.ds(k0, block_k)]
        up = x_ref[0, row, pl.ds(width + k0, block_k)]
        for part in range(1, x_ref.shape[0]):
            gate += x_ref[part, row, pl.ds(k0, block_k)]
            up += x_ref[part, row, pl.ds(width + k0, block_k)]
        act = gate * jax.nn.sigmoid(gate) * up
        return act.astype(act_dtype).astype(jnp.float32)

    def body(i, acc):
        k0 = pl.multiple_of(first_k + i * block_k, block_k)
        w = w_ref[expert, pl.ds(k0, block_k), pl.ds(first_col, block_n)].astype(jnp.float32)
        return acc + inputs(k0)[:, None] * w

    def dot_body(i, acc):  # acc [DOT_ROWS, bn]: row 0 holds the sums, the others zeros
        k0 = pl.multiple_of(first_k + i * block_k, block_k)
        w = w_ref[expert, pl.ds(k0, block_k), pl.ds(first_col, block_n)]
        rows = lax.broadcasted_iota(jnp.int32, (DOT_ROWS, block_k), 0)
        padded = jnp.where(rows == 0, inputs(k0)[None, :], 0.0).astype(w.dtype)
        return acc + pltriton.dot(padded, w)

    is_used = (used_ref[0] != 0).astype(jnp.int32)  # the assignment's combine weight
    if use_dot:
        acc = lax.fori_loop(0, is_used * num_blocks, dot_body,
                            jnp.zeros((DOT_ROWS, block_n), jnp.float32))
        rows = lax.broadcasted_iota(jnp.int32, (DOT_ROWS, block_n), 0)
        o_ref[...] = jnp.sum(jnp.where(rows == 0, acc, 0.0), axis=0)
        return
    acc = lax.fori_loop(0, is_used * num_blocks, body,
                        jnp.zeros((block_k, block_n), jnp.float32))
    o_ref[...] = acc.sum(axis=0)


def _expert_gemv(x, ids, used, w, *, rows_per_input: int, tiles: GemvTiles, interpret: bool,
                 activation: str = "swiglu", act_dtype=None):
    """Row a // rows_per_input of x [R, K] times w[ids[a]] ([E, K, n]) -> f32 partial sums
    [NS, A, n] (NS = tiles.num_splits, to be added); rows of assignments with used[a] == 0
    (`used`: their combine weights, any dtype) are zeros. With `act_dtype` x is a previous
    call's partial sums [NS', R, 2K] (relu2: [NS', R, K]) and the row is the activation of
    their sum (see _gemv_kernel)."""
    A, (_, K, n) = ids.shape[0], w.shape
    bk, bn, NS = tiles.block_k, tiles.block_n, tiles.num_splits
    whole = lambda a: pl.BlockSpec(a.shape, lambda *_: (0,) * a.ndim)  # noqa: E731
    use_dot = gemv_on_tensor_cores(w.dtype) if tiles.use_dot is None else tiles.use_dot
    kernel = functools.partial(_gemv_kernel, rows_per_input=rows_per_input, block_k=bk,
                               num_blocks=K // bk // NS, activation=activation,
                               act_dtype=act_dtype, use_dot=use_dot)
    return pl.pallas_call(
        kernel,
        grid=(A, n // bn, NS),
        in_specs=[pl.BlockSpec((1,), lambda a, j, s: (a,)),
                  pl.BlockSpec((1,), lambda a, j, s: (a,)), whole(x), whole(w)],
        out_specs=pl.BlockSpec((None, None, bn), lambda a, j, s: (s, a, j)),
        out_shape=jax.ShapeDtypeStruct((NS, A, n), jnp.float32),
        compiler_params=pltriton.CompilerParams(num_warps=tiles.num_warps,
                                                num_stages=tiles.num_stages),
        interpret=interpret,
        name="ninfer_moe_expert_gemv",
    )(ids, used, x, w)


def _fused_expert_mlp(x, ids, used, gate_up, down, *, rows_per_input: int, tiles: FusedTiles,
                      activation: str, interpret: bool):
    """Row a // rows_per_input of x [R, H] through expert ids[a]'s MLP, one program per
    (assignment a, width block j): f32 shares [I / block_i, A, H] whose sum over the first
    axis is each assignment's output (zeros for used[a] == 0)."""
    A, H, width = ids.shape[0], x.shape[1], down.shape[1]
    bi = tiles.block_i
    whole = lambda a: pl.BlockSpec(a.shape, lambda *_: (0,) * a.ndim)  # noqa: E731
    if activation not in ("swiglu", "relu2"):
        raise ValueError(f"unknown expert activation {activation!r}")
    kernel = functools.partial(_fused_mlp_kernel, rows_per_input=rows_per_input,
                               block_i=bi, block_k=tiles.block_k, block_n=tiles.block_n,
                               gated=activation == "swiglu")
    return pl.pallas_call(
        kernel,
        grid=(A, width // bi),
        in_specs=[pl.BlockSpec((1,), lambda a, j: (a,)), pl.BlockSpec((1,), lambda a, j: (a,)),
                  whole(x), whole(gate_up), whole(down)],
        out_specs=pl.BlockSpec((None, None, H), lambda a, j: (j, a, 0)),
        out_shape=jax.ShapeDtypeStruct((width // bi, A, H), jnp.float32),
        compiler_params=pltriton.CompilerParams(num_warps=tiles.num_warps,
                                                num_stages=tiles.num_stages),
        interpret=interpret,
        name="ninfer_moe_fused_mlp",
    )(ids, used, x, gate_up, down)


def _fused_mlp_kernel(id_ref, used_ref, x_ref, gu_ref, d_ref, o_ref, *, rows_per_input: int,
                      block_i: int, block_k: int, block_n: int, gated: bool):
    """One (assignment, width block) program: the block's gate and up sums (relu2: up only)
    over the hidden size, their activation rounded to x's dtype (as the reference rounds it
    before the down product), then the block's rows of down times it, stored [H] by column
    blocks. An unused assignment reads no weights and stores zeros."""
    assignment, block = pl.program_id(0), pl.program_id(1)
    expert = id_ref[0]
    row = assignment // rows_per_input
    H, width, bi = x_ref.shape[1], d_ref.shape[1], block_i
    first = pl.multiple_of(block * bi, bi)
    is_used = used_ref[0] != 0
    columns = [first, width + first] if gated else [first]

    def body(i, sums):
        k0 = pl.multiple_of(i * block_k, block_k)
        xs = x_ref[row, pl.ds(k0, block_k)].astype(jnp.float32)[:, None]
        return tuple(acc + xs * gu_ref[expert, pl.ds(k0, block_k), pl.ds(c, bi)].astype(
            jnp.float32) for acc, c in zip(sums, columns))

    init = tuple(jnp.zeros((block_k, bi), jnp.float32) for _ in columns)
    sums = lax.fori_loop(0, is_used.astype(jnp.int32) * (H // block_k), body, init)
    sums = [acc.sum(axis=0) for acc in sums]
    if gated:
        act = sums[0] * jax.nn.sigmoid(sums[0]) * sums[1]
    else:
        act = jnp.square(jnp.maximum(sums[0], 0.0))
    act = act.astype(x_ref.dtype).astype(jnp.float32)[:, None]  # [bi, 1]

    @pl.when(is_used)
    def _down():
        def column_block(c, carry):
            n0 = pl.multiple_of(c * block_n, block_n)
            w = d_ref[expert, pl.ds(first, bi), pl.ds(n0, block_n)].astype(jnp.float32)
            o_ref[pl.ds(n0, block_n)] = (act * w).sum(axis=0)
            return carry

        lax.fori_loop(0, H // block_n, column_block, 0)

    @pl.when(jnp.logical_not(is_used))
    def _zeros():
        o_ref[...] = jnp.zeros((H,), jnp.float32)


# ---------------------------------------------------------------------------- grouped GEMM

def grouped_experts(x, expert_ids, expert_weights, gate_up, down, *, activation="swiglu",
                    interpret=False):
    """The prefill path: a grouped matmul over expert-sorted tiles of assignments."""
    N, top_k = expert_ids.shape
    E, H, I = gate_up.shape[0], gate_up.shape[1], down.shape[1]
    tiles = grouped_tiles(assignments=N * top_k, experts=E, hidden=H, width=I)
    if tiles is None:
        return None
    first = {"swiglu": _gate_up_kernel, "relu2": _up_relu2_kernel}[activation]
    tile_info, row_tokens, position = _tile_plan(expert_ids, E, tiles,
                                                 used=expert_weights != 0)
    act = _grouped_call(first, tile_info, (row_tokens, x), gate_up, tiles,
                        width=I, n=I, block_n=tiles.block_n_gate_up,
                        out_dtype=x.dtype, interpret=interpret)  # [M, I]
    out = _grouped_call(_down_kernel, tile_info, (act,), down, tiles, width=I, n=H,
                        block_n=tiles.block_n_down, out_dtype=jnp.float32,
                        interpret=interpret)  # [M, H]
    return _combine(out[position], expert_weights, x.dtype)


def _tile_plan(expert_ids, num_experts: int, tiles: GroupedTiles, used=None):
    """(tile_info int32 [T, 2]: expert and is-used per tile, row_tokens int32 [M]: the token
    of each padded row (padding rows: token 0), position int32 [A]: each assignment's row).
    `used` bool [N, k] (None: all): assignments that are not (zero combine weight: padding
    tokens, experts of another device) get no row in any tile, so they cost no tiles; their
    position is row 0, whose output their zero weight drops."""
    top_k, bm, T = expert_ids.shape[1], tiles.block_m, tiles.num_tiles
    flat = expert_ids.reshape(-1).astype(jnp.int32)
    if used is not None:  # unused ones sort last, as a group past the experts
        flat = jnp.where(used.reshape(-1), flat, num_experts)
    A = flat.shape[0]
    order = jnp.argsort(flat, stable=True)  # sorted position p -> assignment
    sorted_experts = flat[order]
    sizes = jnp.bincount(flat, length=num_experts + 1).astype(jnp.int32)
    starts = jnp.cumsum(sizes) - sizes
    tile_counts = (sizes[:num_experts] + bm - 1) // bm
    tile_ends = jnp.cumsum(tile_counts)
    tile_starts = jnp.append(tile_ends - tile_counts, 0)  # the unused group: no tiles
    rank = jnp.arange(A, dtype=jnp.int32) - starts[sorted_experts]
    assigned = sorted_experts < num_experts
    padded = jnp.where(assigned, tile_starts[sorted_experts] * bm + rank, T * bm)
    position = jnp.zeros(A, jnp.int32).at[order].set(jnp.where(assigned, padded, 0))
    row_tokens = jnp.zeros(T * bm, jnp.int32).at[padded].set(order // top_k, mode="drop")
    tile = jnp.arange(T, dtype=jnp.int32)
    # compare_all: the default search is a loop, and each XLA loop iteration on a GPU is a
    # host round trip
    tile_expert = jnp.minimum(jnp.searchsorted(tile_ends, tile, side="right",
                                               method="compare_all"), num_experts - 1)
    is_used = (tile < tile_ends[-1]).astype(jnp.int32)
    return jnp.stack([tile_expert.astype(jnp.int32), is_used], axis=1), row_tokens, position


def _gate_up_kernel(info_ref, token_ref, x_ref, w_ref, o_ref, *, width: int, block_k: int,
                    num_blocks: int):
    """One (tile, column block) program: SwiGLU of the tile's rows of x times its expert's
    gate and up columns; o_ref [bm, bn]."""
    expert, is_used = info_ref[0], info_ref[1]
    block_m, block_n = o_ref.shape
    gate_col = pl.multiple_of(pl.program_id(1) * block_n, block_n)
    up_col = pl.multiple_of(width + gate_col, block_n)
    tokens = token_ref[...]  # [bm]

    def body(i, acc):
        gate, up = acc
        k0 = pl.multiple_of(i * block_k, block_k)
        rows = x_ref[tokens, pl.ds(k0, block_k)]  # [bm, bk], gathered
        gate += pltriton.dot(rows, w_ref[expert, pl.ds(k0, block_k), pl.ds(gate_col, block_n)])
        up += pltriton.dot(rows, w_ref[expert, pl.ds(k0, block_k), pl.ds(up_col, block_n)])
        return gate, up

    zeros = jnp.zeros((block_m, block_n), jnp.float32)
    gate, up = lax.fori_loop(0, is_used * num_blocks, body, (zeros, zeros))
    o_ref[...] = (gate * jax.nn.sigmoid(gate) * up).astype(o_ref.dtype)


def _up_relu2_kernel(info_ref, token_ref, x_ref, w_ref, o_ref, *, width: int, block_k: int,
                     num_blocks: int):
    """One (tile, column block) program of gateless experts: relu(rows of x times the
    expert's up columns)^2; o_ref [bm, bn]."""
    del width
    expert, is_used = info_ref[0], info_ref[1]
    block_m, block_n = o_ref.shape
    col = pl.multiple_of(pl.program_id(1) * block_n, block_n)
    tokens = token_ref[...]  # [bm]

    def body(i, acc):
        k0 = pl.multiple_of(i * block_k, block_k)
        rows = x_ref[tokens, pl.ds(k0, block_k)]  # [bm, bk], gathered
        return acc + pltriton.dot(rows, w_ref[expert, pl.ds(k0, block_k), pl.ds(col, block_n)])

    up = lax.fori_loop(0, is_used * num_blocks, body, jnp.zeros((block_m, block_n), jnp.float32))
    o_ref[...] = jnp.square(jnp.maximum(up, 0.0)).astype(o_ref.dtype)


def _down_kernel(info_ref, act_ref, w_ref, o_ref, *, width: int, block_k: int,
                 num_blocks: int):
    """One (tile, column block) program: the tile's SwiGLU rows times its expert's down
    columns; o_ref [bm, bn] float32."""
    del width
    expert, is_used = info_ref[0], info_ref[1]
    block_m, block_n = o_ref.shape
    col = pl.multiple_of(pl.program_id(1) * block_n, block_n)

    def body(i, acc):
        k0 = pl.multiple_of(i * block_k, block_k)
        return acc + pltriton.dot(act_ref[:, pl.ds(k0, block_k)],
                                  w_ref[expert, pl.ds(k0, block_k), pl.ds(col, block_n)])

    o_ref[...] = lax.fori_loop(0, is_used * num_blocks, body,
                               jnp.zeros((block_m, block_n), jnp.float32))


def _grouped_call(kernel, tile_info, inputs, w, tiles: GroupedTiles, *, width: int, n: int,
                  block_n: int, out_dtype, interpret: bool):
    """Run a grouped kernel over grid (tiles, n // block_n); inputs are (row_tokens, x) for
    the gate/up kernel (x gathered per tile) or (act,) for the down kernel (tile-major)."""
    bm, T = tiles.block_m, tiles.num_tiles
    K = w.shape[1]
    whole = lambda a: pl.BlockSpec(a.shape, lambda *_: (0,) * a.ndim)  # noqa: E731
    if len(inputs) == 2:  # row tokens per tile, x whole (rows gathered in the kernel)
        specs = [pl.BlockSpec((bm,), lambda t, j: (t,)), whole(inputs[1])]
    else:  # the tile's own rows
        specs = [pl.BlockSpec((bm, inputs[0].shape[1]), lambda t, j: (t, 0))]
    body = functools.partial(kernel, width=width, block_k=tiles.block_k,
                             num_blocks=K // tiles.block_k)
    return pl.pallas_call(
        body,
        grid=(T, n // block_n),
        in_specs=[pl.BlockSpec((None, 2), lambda t, j: (t, 0)), *specs, whole(w)],
        out_specs=pl.BlockSpec((bm, block_n), lambda t, j: (t, j)),
        out_shape=jax.ShapeDtypeStruct((T * bm, n), out_dtype),
        compiler_params=pltriton.CompilerParams(num_warps=tiles.num_warps,
                                                num_stages=tiles.num_stages),
        interpret=interpret,
        name=f"ninfer_moe_{kernel.__name__.strip('_').removesuffix('_kernel')}",
    )(tile_info, *inputs, w)
