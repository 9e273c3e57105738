"""The gated delta rule's chunked prefill as a Pallas kernel (GPU), same contract as
reference.chunk_gated_delta.

Why: the reference runs the chunk-to-chunk carry as a rolled XLA loop (one launch per chunk
and, in a command buffer, a host round trip per iteration) over float32 products at
Precision.HIGHEST. Here XLA first computes every chunk's WY terms at once (wy.wy_terms:
batched matmuls, the triangular inverse by blockwise doubling), then one kernel program per
(value head, block of value columns) walks the chunks in order with its [dk, BV] slice of the
state in registers: per chunk it loads q, k, W, U and the cumulative log decay G once and
    V' = U - W S;  O = (q k^T * D) V' + (q S) * e^G;  S <- e^{G_C} S + (k e^{G_C - G})^T V'
(D_ij = e^{G_i - G_j} for j <= i), writing O. The state never leaves the registers between
chunks; the column blocks of one head are independent (each reads all of W and k).

Precision as wy.py: bf16 v (a bf16 model) -> bf16 operands, float32 accumulation and state;
float32 v -> float32 products at HIGHEST (interpret-mode tests against the reference).
Lowering: Pallas' Triton backend (as kernels/moe), tested in interpret mode on CPU and lowered
for CUDA there (tests/kernels/test_gated_delta.py); native run: the same file, `-m gpu`.
Every loaded block is a power of two (C, dk, BV >= 16), so the kernel tiles when dk and dv are
powers of two of at least 16; otherwise `chunk_gated_delta` returns None.
Shape letters: T tokens (T' padded to N chunks of C), Hk key heads, Hv value heads (value head
h reads key head h // (Hv / Hk)), dk / dv head dims, BV value columns per program.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ninfer_jax.kernels.gated_delta import wy
from ninfer_jax.kernels.gated_delta.reference import CHUNK_SIZE
from ninfer_jax.kernels.tiling import is_power_of_2

NUM_WARPS = 4
NUM_STAGES = 1
TARGET_PROGRAMS = 128  # about one per SM of an H100 / H200 (132)


def tiles(chunk_size: int, key_dim: int, value_dim: int) -> bool:
    """Whether the kernel takes these dims (Triton dots want powers of two >= 16)."""
    return all(d >= 16 and is_power_of_2(d) for d in (chunk_size, key_dim, value_dim))


def value_block(num_value_heads: int, value_dim: int) -> int:
    """Value columns per program: halved from dv (not below 32) until the grid has about
    TARGET_PROGRAMS programs, since each program is a serial walk over the chunks."""
    block = value_dim
    while block > 32 and num_value_heads * (value_dim // block) < TARGET_PROGRAMS:
        block //= 2
    return block


def chunk_gated_delta(q, k, v, g, beta, initial_state, num_tokens, *, chunk_size=CHUNK_SIZE,
                      block_v: int | None = None, num_warps: int = NUM_WARPS,
                      num_stages: int = NUM_STAGES, interpret: bool = False):
    """See reference.chunk_gated_delta; None when the shapes do not tile."""
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1:]
    if not tiles(chunk_size, dk, dv):
        return None
    block_v = block_v or value_block(Hv, dv)
    dot_dtype = wy.matmul_dtype(v)
    is_real = (jnp.arange(T) < num_tokens)[:, None]
    g, beta = (jnp.where(is_real, x.astype(jnp.float32), 0.0) for x in (g, beta))
    q, k, v, g, beta = wy.pad_to_chunks((q, k, v, g, beta), chunk_size)
    T_pad = q.shape[0]
    # heads lead, [H, T', d]: each program reads its head's rows contiguously
    q, k, v = (x.transpose(1, 0, 2) for x in (q, k, v))
    g, beta = g.T, beta.T

    def chunked(x):  # [H, T', ...] -> [H, N, C, ...]
        return x.reshape(x.shape[0], -1, chunk_size, *x.shape[2:])

    k_per_value = jnp.repeat(k.astype(jnp.float32), Hv // Hk, axis=0)
    w, u, G = wy.wy_terms(chunked(k_per_value), chunked(v.astype(jnp.float32)), chunked(g),
                          chunked(beta), dot_dtype)
    out, state = _scan_call(
        q.astype(dot_dtype), k.astype(dot_dtype), w.reshape(Hv, T_pad, dk).astype(dot_dtype),
        u.reshape(Hv, T_pad, dv).astype(dot_dtype), G.reshape(Hv, T_pad),
        initial_state.astype(jnp.float32), chunk_size=chunk_size, block_v=block_v,
        num_warps=num_warps, num_stages=num_stages, interpret=interpret)
    return out.transpose(1, 0, 2)[:T], state


def _scan_kernel(q_ref, k_ref, w_ref, u_ref, g_ref, s0_ref, o_ref, s_ref, *, chunk_size: int,
                 num_chunks: int):
    """One (value head, column block): q/k/w_ref [T', dk], u_ref [T', BV], g_ref [T'],
    s0/s_ref [dk, BV], o_ref [T', BV]."""
    C = chunk_size
    dtype = q_ref.dtype
    precision = lax.Precision.HIGHEST if dtype == jnp.float32 else None
    dot = functools.partial(pltriton.dot, precision=precision)
    is_past = (lax.broadcasted_iota(jnp.int32, (C, C), 1)
               <= lax.broadcasted_iota(jnp.int32, (C, C), 0))
    is_last = lax.broadcasted_iota(jnp.int32, (C,), 0) == C - 1

    def chunk(c, state):
        rows = pl.ds(pl.multiple_of(c * C, C), C)
        q, k, w = q_ref[rows, :], k_ref[rows, :], w_ref[rows, :]
        G = g_ref[rows]
        G_last = jnp.sum(jnp.where(is_last, G, 0.0))  # a reduction, not a scalar load
        state_in = state.astype(dtype)
        new_values = u_ref[rows, :].astype(jnp.float32) - dot(w, state_in)  # [C, BV]
        new_values_in = new_values.astype(dtype)
        # exp only of G_i - G_j <= 0: the masked entries would overflow
        decay = jnp.where(is_past, jnp.exp(jnp.minimum(G[:, None] - G[None, :], 0.0)), 0.0)
        scores = (dot(q, k, trans_b=True) * decay).astype(dtype)  # [C, C]
        o_ref[rows, :] = (dot(q, state_in) * jnp.exp(G)[:, None]
                          + dot(scores, new_values_in))
        k_to_end = (k.astype(jnp.float32) * jnp.exp(G_last - G)[:, None]).astype(dtype)
        return state * jnp.exp(G_last) + dot(k_to_end, new_values_in, trans_a=True)

    s_ref[...] = lax.fori_loop(0, num_chunks, chunk, s0_ref[...])


def _scan_call(q, k, w, u, G, state, *, chunk_size: int, block_v: int, num_warps: int,
               num_stages: int, interpret: bool):
    Hk, T_pad, dk = q.shape
    Hv, dv = u.shape[0], u.shape[-1]
    group = Hv // Hk
    kernel = functools.partial(_scan_kernel, chunk_size=chunk_size,
                               num_chunks=T_pad // chunk_size)
    key_rows = pl.BlockSpec((None, T_pad, dk), lambda h, j: (h // group, 0, 0))
    read_rows = pl.BlockSpec((None, T_pad, dk), lambda h, j: (h, 0, 0))
    value_cols = pl.BlockSpec((None, T_pad, block_v), lambda h, j: (h, 0, j))
    state_cols = pl.BlockSpec((None, dk, block_v), lambda h, j: (h, 0, j))
    return pl.pallas_call(
        kernel,
        grid=(Hv, dv // block_v),
        in_specs=[key_rows, key_rows, read_rows, value_cols,
                  pl.BlockSpec((None, T_pad), lambda h, j: (h, 0)), state_cols],
        out_specs=[value_cols, state_cols],
        out_shape=[jax.ShapeDtypeStruct((Hv, T_pad, dv), jnp.float32),
                   jax.ShapeDtypeStruct((Hv, dk, dv), jnp.float32)],
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="ninfer_gated_delta_chunk_scan",
    )(q, k, w, u, G, state)
