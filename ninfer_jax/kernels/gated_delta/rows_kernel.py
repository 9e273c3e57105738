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

conv_gated_delta_rows is the same kernel started one step earlier, from the layer's in_qkv
output: each program also runs the causal conv over its channels (its key head's q and k, its
block of v), SiLU and the q / k L2 norms in registers, where XLA ran them as ~5 small fusions
per Gated DeltaNet layer (run 52c: 1-2.4 us each, 30 layers of the 35B-A3B). The rows' new
conv windows come back as an output [B, K-1, D_c] that the caller stores at the slots:
writing them in place would race (every program of a key head reads that head's q / k
window; one of them would shift it first). The q / k windows are written by the key head's
first program (value head h with h % group == 0, dv block 0), v channels by their own.
Given the fused in_qkvzba output and (A_log, dt_bias) instead of gates, each program also
computes its row and value head's g and beta from the b and a columns.

Lowering: Pallas' Triton backend, tested in interpret mode on CPU against the reference.
Shape letters: B rows, Hk/Hv key/value heads, dk/dv their dims, S state slots, K conv taps,
D_c conv channels (q | k | v: 2 Hk dk + Hv dv). The kernel reads the conv inputs in place from
a wider array (the fused projection's output, z | b | a past D_c): slicing them out for a
custom call would be a copy kernel of its own.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ninfer_jax.kernels.gated_delta.reference import L2_EPS
from ninfer_jax.kernels.tiling import fit_tile

BLOCK_DV = 32  # dv columns per program: a [dk, 32] float32 tile stays in registers
MIN_TILE = 16


def gated_delta_rows(q, k, v, g, beta, recurrent, slots, *, interpret: bool = False):
    """q, k [B, Hk, dk], v [B, Hv, dv], g, beta [B, Hv], recurrent f32 [S, Hv, dk, dv],
    slots int32 [B] -> (out f32 [B, Hv, dv], recurrent with each non-dummy row's new state
    at its slot); None when the shapes do not tile."""
    return gated_rows(q, k, v, jnp.stack([g, beta], axis=-1), recurrent, slots,
                      interpret=interpret)


def gated_rows(q, k, v, gates, recurrent, slots, *, interpret: bool = False):
    """gated_delta_rows with g and beta as one array gates [B, Hv, 2] (the model's: slicing
    them apart for the kernel would be two copies)."""
    B, Hk, dk = k.shape
    Hv, dv = v.shape[1], v.shape[2]
    block_dv = _block_dv(recurrent, Hk)
    if block_dv is None:
        return None
    whole = lambda a: pl.BlockSpec(a.shape, lambda *_: (0,) * a.ndim)  # noqa: E731
    kernel = functools.partial(_rows_kernel, group=Hv // Hk)
    out, recurrent = pl.pallas_call(
        kernel,
        grid=(B, Hv, dv // block_dv),
        in_specs=[pl.BlockSpec((1,), lambda b, h, c: (b,)), whole(q), whole(k),
                  pl.BlockSpec((None, None, block_dv), lambda b, h, c: (b, h, c)),
                  pl.BlockSpec((None, None, 2), lambda b, h, c: (b, h, 0)),
                  whole(recurrent)],
        out_specs=[pl.BlockSpec((None, None, block_dv), lambda b, h, c: (b, h, c)),
                   whole(recurrent)],
        out_shape=[jax.ShapeDtypeStruct((B, Hv, dv), jnp.float32),
                   jax.ShapeDtypeStruct(recurrent.shape, recurrent.dtype)],
        input_output_aliases={5: 1},
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="ninfer_gated_delta_rows",
    )(slots.astype(jnp.int32), q, k, v, gates.astype(jnp.float32), recurrent)
    return out, recurrent


def conv_gated_delta_rows(mixed, conv_weight, conv, gates, recurrent, slots, *,
                          key_heads: int, decay=None, interpret: bool = False):
    """Same contract as reference.conv_gated_delta_rows: (out f32 [B, Hv, dv], the rows' new
    conv windows [B, K-1, D_c], recurrent updated in place); None when the shapes do not
    tile. With gates None each program computes its (row, value head)'s g and beta from
    mixed's b and a columns (the fused in_qkvzba output) and decay = (A_log, dt_bias), where
    XLA spent a fusion per layer on them (run 57: 1.5 us, 30 layers of the 35B-A3B)."""
    B, D_c = mixed.shape[0], conv_weight.shape[1]
    Hv, dk, dv = recurrent.shape[1:]
    block_dv = _block_dv(recurrent, key_heads)
    taps = conv_weight.shape[0]
    if block_dv is None or D_c != 2 * key_heads * dk + Hv * dv or taps < 2:
        return None
    if gates is None and mixed.shape[1] != D_c + Hv * dv + 2 * Hv:
        return None
    whole = lambda a: pl.BlockSpec(a.shape, lambda *_: (0,) * a.ndim)  # noqa: E731
    if gates is None:
        gate_args = [decay[0].astype(jnp.float32), decay[1].astype(jnp.float32)]
        gate_specs = [whole(arg) for arg in gate_args]
    else:
        gate_args = [gates.astype(jnp.float32)]
        gate_specs = [pl.BlockSpec((None, None, 2), lambda b, h, c: (b, h, 0))]
    kernel = functools.partial(_conv_rows_kernel, group=Hv // key_heads,
                               key_dim=key_heads * dk, gates_at=D_c + Hv * dv)
    window = jax.ShapeDtypeStruct((B, taps - 1, D_c), conv.dtype)
    state_index = 4 + len(gate_args)
    out, window, recurrent = pl.pallas_call(
        kernel,
        grid=(B, Hv, dv // block_dv),
        in_specs=[pl.BlockSpec((1,), lambda b, h, c: (b,)), whole(mixed), whole(conv_weight),
                  whole(conv), *gate_specs, whole(recurrent)],
        out_specs=[pl.BlockSpec((None, None, block_dv), lambda b, h, c: (b, h, c)),
                   whole(window), whole(recurrent)],
        out_shape=[jax.ShapeDtypeStruct((B, Hv, dv), jnp.float32), window,
                   jax.ShapeDtypeStruct(recurrent.shape, recurrent.dtype)],
        input_output_aliases={state_index: 2},
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="ninfer_conv_gated_delta_rows",
    )(slots.astype(jnp.int32), mixed, conv_weight, conv, *gate_args, recurrent)
    return out, window, recurrent


def _conv_rows_kernel(slot_ref, x_ref, w_ref, conv_ref, *refs, group: int, key_dim: int,
                      gates_at: int):
    """One (row, value head, dv block) program: the conv of its channels, then the rule as
    _rows_kernel applies it; o_ref [bv], the row's window channels it owns, the state tile.
    refs: the gates' block [2] (g, beta), or A_log and dt_bias [Hv] whole for the gates from
    the row's b and a columns of x_ref (at gates_at and gates_at + Hv); then the state, the
    outputs."""
    *gate_refs, state_ref, o_ref, window_ref, new_ref = refs
    row, head, block = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    slot = slot_ref[0]
    block_dv, (dk, dv) = o_ref.shape[0], state_ref.shape[2:]
    taps = w_ref.shape[0]
    col = pl.multiple_of(block * block_dv, block_dv)
    q_at = pl.multiple_of((head // group) * dk, dk)
    k_at = pl.multiple_of(key_dim + q_at, dk)
    v_at = pl.multiple_of(2 * key_dim + head * dv + col, block_dv)

    def activated(at, width):
        """SiLU of the conv over channels [at, at + width), rounded to the input dtype as the
        reference rounds it before splitting heads; float32."""
        channels = pl.ds(at, width)
        acc = x_ref[row, channels].astype(jnp.float32) * w_ref[taps - 1, channels].astype(
            jnp.float32)
        for tap in range(taps - 1):
            past = conv_ref[slot, tap, channels].astype(x_ref.dtype).astype(jnp.float32)
            acc += past * w_ref[tap, channels].astype(jnp.float32)
        return (acc * jax.nn.sigmoid(acc)).astype(x_ref.dtype).astype(jnp.float32)

    def shift_window(at, width):
        channels = pl.ds(at, width)
        for tap in range(taps - 2):
            window_ref[row, tap, channels] = conv_ref[slot, tap + 1, channels]
        window_ref[row, taps - 2, channels] = x_ref[row, channels].astype(window_ref.dtype)

    shift_window(v_at, block_dv)

    @pl.when((head % group == 0) & (block == 0))
    def _():
        shift_window(q_at, dk)
        shift_window(k_at, dk)

    o_ref[...] = jnp.zeros((block_dv,), jnp.float32)

    @pl.when(slot != 0)
    def _():
        q = activated(q_at, dk)
        q = q * jax.lax.rsqrt(jnp.sum(q * q) + L2_EPS) * dk ** -0.5
        k = activated(k_at, dk)
        k = k * jax.lax.rsqrt(jnp.sum(k * k) + L2_EPS)
        if len(gate_refs) == 1:
            g, beta = gate_refs[0][0], gate_refs[0][1]
        else:  # reference.decay_gates of this row and head
            log_a_ref, dt_bias_ref = gate_refs
            heads = log_a_ref.shape[0]
            b = x_ref[row, gates_at + head].astype(jnp.float32)
            a = x_ref[row, gates_at + heads + head].astype(jnp.float32)
            beta = jax.nn.sigmoid(b)
            g = -jnp.exp(log_a_ref[head]) * jax.nn.softplus(a + dt_bias_ref[head])
        _apply_rule(q, k, activated(v_at, block_dv), g, beta, state_ref, o_ref, new_ref,
                    slot=slot, head=head, col=col)


def _rows_kernel(slot_ref, q_ref, k_ref, v_ref, gates_ref, state_ref, o_ref, new_ref, *,
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
        _apply_rule(q_ref[row, key_head, :].astype(jnp.float32),
                    k_ref[row, key_head, :].astype(jnp.float32),
                    v_ref[...].astype(jnp.float32), gates_ref[0], gates_ref[1], state_ref,
                    o_ref, new_ref, slot=slot, head=head, col=col)


def _block_dv(recurrent, key_heads: int) -> int | None:
    """The dv columns per program for states recurrent [S, Hv, dk, dv], or None when the
    shapes do not tile (or the state is not float32)."""
    Hv, dk, dv = recurrent.shape[1:]
    block_dv = fit_tile(dv, BLOCK_DV, MIN_TILE)
    if (block_dv is None or fit_tile(dk, dk, MIN_TILE) != dk or Hv % key_heads
            or recurrent.dtype != jnp.float32):
        return None
    return block_dv


def _apply_rule(q, k, v, g, beta, state_ref, o_ref, new_ref, *, slot, head, col):
    """One token of the rule on the slot's state tile [dk, bv] at dv column `col`, in place:
    q, k [dk], v [bv] float32, g and beta float32 scalars; o_ref [bv] gets S^T q."""
    block_dv = o_ref.shape[0]
    state = state_ref[slot, head, :, pl.ds(col, block_dv)]
    state = state * jnp.exp(g)
    predicted = jnp.sum(state * k[:, None], axis=0)  # S^T k
    state = state + k[:, None] * ((v - predicted) * beta)[None, :]
    o_ref[...] = jnp.sum(state * q[:, None], axis=0)
    new_ref[slot, head, :, pl.ds(col, block_dv)] = state
