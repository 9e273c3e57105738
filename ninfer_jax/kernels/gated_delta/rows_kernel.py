"""The one-token gated delta rule of a decode batch as a Pallas kernel (GPU), same contract as
reference.gated_delta_rows.

Why: XLA runs a decode row's update as a gather of its slot's state [Hv, dk, dv] (float32,
2 MiB per row in the 35B-A3B), a few fusions and batched dots that each pass over it, and a
scatter back; at batch 1 that is several launches and passes per Gated DeltaNet layer for a
few MiB. Here one program per (row, value head, dv block) reads its slot's state tile once,
in place, applies the rule in registers and writes the tile back in place (the state array
is aliased to the output). Every dv column of the rule is independent (the state's columns
are updated by k (x) beta (v - S^T k), column by column), so the split over dv blocks is
exact. Rows on the dummy slot 0 (padding) read and write nothing; their outputs are zeros.

Lowering: Pallas' Triton backend, tested in interpret mode on CPU against the reference.
Shape letters: B rows, Hk/Hv key/value heads, dk/dv their dims, S state slots.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ninfer_jax.kernels.tiling import fit_tile

BLOCK_DV = 32  # dv columns per program: a [dk, 32] float32 tile stays in registers
MIN_TILE = 16


def gated_delta_rows(q, k, v, g, beta, recurrent, slots, *, interpret: bool = False):
    """q, k [B, Hk, dk], v [B, Hv, dv], g, beta [B, Hv], recurrent f32 [S, Hv, dk, dv],
    slots int32 [B] -> (out f32 [B, Hv, dv], recurrent with each non-dummy row's new state
    at its slot); None when the shapes do not tile."""
    B, Hk, dk = k.shape
    Hv, dv = v.shape[1], v.shape[2]
    block_dv = fit_tile(dv, BLOCK_DV, MIN_TILE)
    if (block_dv is None or fit_tile(dk, dk, MIN_TILE) != dk or Hv % Hk
            or recurrent.dtype != jnp.float32):
        return None
    whole = lambda a: pl.BlockSpec(a.shape, lambda *_: (0,) * a.ndim)  # noqa: E731
    kernel = functools.partial(_rows_kernel, group=Hv // Hk)
    scalars = pl.BlockSpec((None, None, 1), lambda b, h, c: (b, h, 0))
    out, recurrent = pl.pallas_call(
        kernel,
        grid=(B, Hv, dv // block_dv),
        in_specs=[pl.BlockSpec((1,), lambda b, h, c: (b,)), whole(q), whole(k),
                  pl.BlockSpec((None, None, block_dv), lambda b, h, c: (b, h, c)),
                  scalars, scalars, whole(recurrent)],
        out_specs=[pl.BlockSpec((None, None, block_dv), lambda b, h, c: (b, h, c)),
                   whole(recurrent)],
        out_shape=[jax.ShapeDtypeStruct((B, Hv, dv), jnp.float32),
                   jax.ShapeDtypeStruct(recurrent.shape, recurrent.dtype)],
        input_output_aliases={6: 1},
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="ninfer_gated_delta_rows",
    )(slots.astype(jnp.int32), q, k, v, g[:, :, None].astype(jnp.float32),
      beta[:, :, None].astype(jnp.float32), recurrent)
    return out, recurrent


def _rows_kernel(slot_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, state_ref, o_ref, new_ref, *,
                 group: int):
    """One (row, value head, dv block) program: o_ref [bv] and the slot's state tile."""
    row, head = pl.program_id(0), pl.program_id(1)
    slot = slot_ref[0]
    block_dv = o_ref.shape[0]
    col = pl.multiple_of(pl.program_id(2) * block_dv, block_dv)
    key_head = head // group
    o_ref[...] = jnp.zeros((block_dv,), jnp.float32)

    @pl.when(slot != 0)
    def _():
        q = q_ref[row, key_head, :].astype(jnp.float32)
        k = k_ref[row, key_head, :].astype(jnp.float32)
        state = state_ref[slot, head, :, pl.ds(col, block_dv)]  # [dk, bv]
        state = state * jnp.exp(g_ref[0])
        predicted = jnp.sum(state * k[:, None], axis=0)  # S^T k
        correction = (v_ref[...].astype(jnp.float32) - predicted) * beta_ref[0]
        state = state + k[:, None] * correction[None, :]
        o_ref[...] = jnp.sum(state * q[:, None], axis=0)
        new_ref[slot, head, :, pl.ds(col, block_dv)] = state
