"""Mamba-2's chunked SSD scan as a Pallas kernel (GPU), same contract as reference.chunk_ssd.

Why: XLA runs the reference as a chain of batched einsums over every chunk (each [chunks, Hm,
L, L] or [chunks, Hm, P, N] intermediate written to and read back from HBM) and then a rolled
loop for the chunk-to-chunk carry, one launch per chunk. Here one program per head walks its
chunks in order with the [P, N] state in registers: per chunk it loads x*dt, B, C and the
cumulative log decay once, forms the decayed C B^T block, and writes y; nothing else touches
HBM.

Lowering: Pallas' Triton backend (as kernels/moe and paged_attention), tested in interpret mode
on CPU. The products run in full f32 (Precision.HIGHEST: the state must not drift through TF32
products, as in the reference). XLA prepares the inputs around the call: dt zeroed on padding
tokens, x * dt, the in-chunk cumulative sums G of dt * A, and the D skip added afterwards.
The kernel tiles when L, P and N are powers of two of at least 16 (Triton's dot); otherwise
`chunk_ssd` returns None and the caller runs the reference.
Shape letters: T tokens (T' padded to chunks of L), Hm heads of dim P, G groups of state N.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ninfer_jax.kernels.mamba2.reference import CHUNK_SIZE
from ninfer_jax.kernels.tiling import is_power_of_2

NUM_WARPS = 4
_HIGHEST = lax.Precision.HIGHEST


def tiles(chunk_size: int, head_dim: int, state_size: int) -> bool:
    """Whether the kernel takes these dims (Triton dots want powers of two >= 16)."""
    return all(d >= 16 and is_power_of_2(d) for d in (chunk_size, head_dim, state_size))


def chunk_ssd(x, dt, A, B, C, D, initial_state, num_tokens, *, chunk_size=CHUNK_SIZE,
              interpret: bool = False):
    """See reference.chunk_ssd; None when the shapes do not tile."""
    T, Hm, P = x.shape
    G, N = B.shape[1], B.shape[2]
    L = chunk_size
    if not tiles(L, P, N):
        return None
    pad = -T % L
    is_real = (jnp.arange(T) < num_tokens)[:, None]
    dt = jnp.where(is_real, dt.astype(jnp.float32), 0.0)
    x32 = x.astype(jnp.float32)
    # heads (groups) lead, so each program reads contiguous rows
    x_dt = jnp.pad(x32 * dt[..., None], [(0, pad), (0, 0), (0, 0)]).transpose(1, 0, 2)
    log_decay = jnp.pad(dt * A.astype(jnp.float32)[None], [(0, pad), (0, 0)])
    G_sum = jnp.cumsum(log_decay.T.reshape(Hm, -1, L), axis=-1).reshape(Hm, T + pad)
    B_t, C_t = (jnp.pad(v.astype(jnp.float32), [(0, pad), (0, 0), (0, 0)]).transpose(1, 0, 2)
                for v in (B, C))
    y, state = _scan_call(x_dt, G_sum, B_t, C_t, initial_state.astype(jnp.float32),
                          heads_per_group=Hm // G, chunk_size=L, interpret=interpret)
    y = y.transpose(1, 0, 2)[:T]
    return y + D.astype(jnp.float32)[:, None] * x32, state


def _scan_kernel(x_ref, g_ref, b_ref, c_ref, s0_ref, y_ref, s_ref, *, chunk_size: int,
                 num_chunks: int):
    """One head: x_ref [T', P], g_ref [T'], b_ref/c_ref [T', N] (its group's), s0/s [P, N]."""
    L = chunk_size
    rows_i = lax.broadcasted_iota(jnp.int32, (L, L), 0)
    cols_j = lax.broadcasted_iota(jnp.int32, (L, L), 1)

    def chunk(c, state):
        rows = pl.ds(pl.multiple_of(c * L, L), L)
        x_dt, g, b, cc = x_ref[rows, :], g_ref[rows], b_ref[rows, :], c_ref[rows, :]
        g_last = g_ref[c * L + L - 1]
        # exp only of g_i - g_j <= 0: the masked entries would overflow
        decay = jnp.where(cols_j <= rows_i,
                          jnp.exp(jnp.minimum(g[:, None] - g[None, :], 0.0)), 0.0)
        scores = pltriton.dot(cc, b, trans_b=True, precision=_HIGHEST) * decay  # [L, L]
        y = pltriton.dot(scores, x_dt, precision=_HIGHEST)  # within the chunk
        y += pltriton.dot(cc, state, trans_b=True, precision=_HIGHEST) * jnp.exp(g)[:, None]
        y_ref[rows, :] = y
        x_to_end = x_dt * jnp.exp(g_last - g)[:, None]
        return state * jnp.exp(g_last) + pltriton.dot(x_to_end, b, trans_a=True,
                                                      precision=_HIGHEST)

    s_ref[...] = lax.fori_loop(0, num_chunks, chunk, s0_ref[...])


def _scan_call(x_dt, G_sum, B_t, C_t, state, *, heads_per_group: int, chunk_size: int,
               interpret: bool):
    Hm, T_pad, P = x_dt.shape
    N = B_t.shape[-1]
    kernel = functools.partial(_scan_kernel, chunk_size=chunk_size,
                               num_chunks=T_pad // chunk_size)
    def per_head(*shape):
        return pl.BlockSpec((None, *shape), lambda h: (h,) + (0,) * len(shape))

    per_group = pl.BlockSpec((None, T_pad, N), lambda h: (h // heads_per_group, 0, 0))
    return pl.pallas_call(
        kernel,
        grid=(Hm,),
        in_specs=[per_head(T_pad, P), per_head(T_pad), per_group, per_group, per_head(P, N)],
        out_specs=[per_head(T_pad, P), per_head(P, N)],
        out_shape=[jax.ShapeDtypeStruct((Hm, T_pad, P), jnp.float32),
                   jax.ShapeDtypeStruct((Hm, P, N), jnp.float32)],
        compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
        name="ninfer_mamba2_chunk_scan",
    )(x_dt, G_sum, B_t, C_t, state)
