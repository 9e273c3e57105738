"""The softmax router's tail as one Pallas kernel (GPU), same contract as
routing.reference_softmax_top_experts.

Why: in a decode step XLA runs that tail as about nine kernels of 1-2 us per MoE layer
(top_k, the exponentials and their normalisation, the padding rows' argmax over `live` and
selects, the shared gate's sigmoid, the concatenations): some 360 launches in a step of the
35B-A3B's 40 MoE layers, for a few KiB of data. Here one program per row does all of it in
registers and writes the ids and weights the expert kernels take. It reads the router's
product as it comes, router | shared_gate columns side by side, so no slice runs before it.

Layout: grid (N,). A padding row needs the first live row's experts; rather than wait on
another program, each program scans the whole `live` vector (N <= routing.MAX_KERNEL_ROWS)
and a padding row recomputes the top k of that row's logits, then writes zero weights. Top
k: k rounds of a max and the lowest index holding it over the E logits, each round masking
its choice out (ties go to the lower index, as lax.top_k). The k (or k + 1) columns live in a
vector of W lanes, W the next power of two: each output row is a block of W lanes overhanging
the [N, k'] arrays, stored through a mask, as `live` is read.

Lowering: Pallas' Triton backend, whose loads and stores must be of power-of-two lanes (hence
a power-of-two E and the masked blocks); no sort, no gather. One warp per program: E = 256
logits are 8 a thread, and each of the 2k reductions stays within the warp's shuffles.
Tested in interpret mode on CPU against the reference; lowered for CUDA at the 35B-A3B shape.
Shape letters: N rows, E experts, C logit columns (E, or E + 1 with the shared gate's),
k experts per token, W output lanes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

# Vectors of at least 16 lanes, the smallest tile of the other Triton kernels here (fewer
# would lower too, but have not run natively).
MIN_LANES = 16


def softmax_top_experts(logits, live, *, num_experts: int, top_k: int,
                        shared_expert: bool = False, weights_dtype=jnp.float32,
                        interpret: bool = False):
    """logits f32 [N, C], live bool [N] or None -> (ids int32 [N, k'], weights [N, k'] in
    weights_dtype); None when E is not a power of two or the shapes do not fit (see
    routing.py)."""
    N, C = logits.shape
    E = num_experts
    if E & (E - 1) or not 0 < top_k <= E or C < E + shared_expert:
        return None
    columns = top_k + shared_expert
    live = jnp.ones((N,), jnp.int32) if live is None else live.astype(jnp.int32)
    row_lanes, lanes = _lanes(N), _lanes(columns)
    kernel = functools.partial(_router_kernel, num_rows=N, num_experts=E, top_k=top_k,
                               shared_expert=shared_expert)
    # `live` and each output row as blocks of power-of-two lanes overhanging the arrays'
    # ends: the kernel reads and writes them through masks
    row = pl.BlockSpec((None, lanes), lambda r: (r, 0))
    ids, weights = pl.pallas_call(
        kernel,
        grid=(N,),
        in_specs=[pl.BlockSpec((row_lanes,), lambda r: (0,)),
                  pl.BlockSpec(logits.shape, lambda r: (0, 0))],
        out_specs=[row, row],
        out_shape=[jax.ShapeDtypeStruct((N, columns), jnp.int32),
                   jax.ShapeDtypeStruct((N, columns), weights_dtype)],
        compiler_params=pltriton.CompilerParams(num_warps=1, num_stages=1),
        interpret=interpret,
        name="ninfer_moe_router",
    )(live, logits.astype(jnp.float32))
    return ids, weights


def _lanes(n: int) -> int:
    return max(pl.next_power_of_2(n), MIN_LANES)


def _router_kernel(live_ref, logits_ref, ids_ref, weights_ref, *, num_rows: int,
                   num_experts: int, top_k: int, shared_expert: bool):
    """One row's program: ids_ref, weights_ref [W] (this row's outputs, lanes past k' outside
    the arrays), live_ref [N rounded up to a power of two], logits_ref [N, C] whole."""
    row = pl.program_id(0)
    is_live = live_ref[row] != 0
    source = row
    if num_rows > 1:  # a lone row is its own first live row, or row 0
        source = jnp.where(is_live, row, _first_live_row(live_ref, num_rows))
    lanes = ids_ref.shape[0]
    ids, top, peak = _top_k(logits_ref[source, pl.ds(0, num_experts)], top_k, lanes)
    scaled = jnp.exp(top - peak)  # lanes past k hold -inf: exp gives 0
    weights = jnp.where(is_live, scaled / jnp.sum(scaled), 0.0)
    lane = jnp.arange(lanes, dtype=jnp.int32)
    if shared_expert:
        gate = jnp.where(is_live, jax.nn.sigmoid(logits_ref[row, num_experts]), 0.0)
        ids = jnp.where(lane == top_k, num_experts, ids)
        weights = jnp.where(lane == top_k, gate, weights)
    stored = lane < top_k + shared_expert
    pltriton.store(ids_ref, ids, mask=stored)
    pltriton.store(weights_ref, weights.astype(weights_ref.dtype), mask=stored)


def _first_live_row(live_ref, num_rows: int):
    """The lowest live row index, 0 when none is live (jnp.argmax of `live`)."""
    row_lanes = live_ref.shape[0]
    rows = jnp.arange(row_lanes, dtype=jnp.int32)
    live = pltriton.load(live_ref, mask=rows < num_rows, other=0)
    first = jnp.min(jnp.where(live != 0, rows, row_lanes))
    return jnp.where(first < num_rows, first, 0)


def _top_k(logits, top_k: int, lanes: int):
    """logits [E] -> (ids int32 [W], their logits f32 [W], the largest logit): lanes 0..k-1
    in lax.top_k's order, lanes past k id 0 and -inf."""
    num_experts = logits.shape[0]
    experts = jnp.arange(num_experts, dtype=jnp.int32)
    lane = jnp.arange(lanes, dtype=jnp.int32)
    ids = jnp.zeros((lanes,), jnp.int32)
    top = jnp.full((lanes,), -jnp.inf, jnp.float32)
    # `taken` rather than overwriting chosen logits with -inf: -inf logits stay eligible
    taken = jnp.zeros((num_experts,), jnp.bool_)
    for k in range(top_k):
        best = jnp.max(jnp.where(taken, -jnp.inf, logits))
        choice = jnp.min(jnp.where(jnp.logical_and(jnp.logical_not(taken), logits == best),
                                   experts, num_experts))
        taken = jnp.logical_or(taken, experts == choice)
        ids = jnp.where(lane == k, choice, ids)
        top = jnp.where(lane == k, best, top)
        peak = best if k == 0 else peak
    return ids, top, peak
