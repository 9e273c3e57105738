"""The gated delta rule's chunked prefill in WY/UT form, matmul-shaped (pure jnp, any backend).

Same contract as reference.chunk_gated_delta; what differs is how each chunk's unit
lower-triangular system is solved and the matmul precision:
  - (I + A)^-1 is built by blockwise inversion (wy_inverse: the diagonal blocks of size 1, 2,
    4, ... of every chunk at once, two batched matmuls per doubling), the order of forward
    substitution but without a per-token loop, so XLA (and the Pallas kernel that shares
    wy_terms) sees batched matmuls only, where the reference calls triangular_solve;
  - the matmul operands take v's dtype: float32 in, Precision.HIGHEST (equal to the recurrent
    scan within ~1e-5); bfloat16 in, bf16 operands with float32 accumulation, the state and
    the decays kept in float32 (flash-linear-attention's chunk_gated_delta_rule does the same).
Per chunk of C tokens (G the in-chunk cumulative log decay, D_ij = exp(G_i - G_j) for j <= i,
A = strict_lower(beta K K^T * D), T = (I + A)^-1):
    W = T (beta K e^G)   how much each write reads of the incoming state S
    U = T (beta V)       the values the chunk writes from a zero state
then, chunk after chunk (the only sequential part, a lax.scan over T/C chunks):
    V' = U - W S;  O = (Q e^G) S + (Q K^T * D) V';  S <- e^{G_C} S + (K e^{G_C - G})^T V'.
Shape letters: T tokens (T' padded to N chunks of C), Hv value heads, dk / dv head dims.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ninfer_jax.kernels.gated_delta.reference import CHUNK_SIZE, _prepare

_HIGHEST = jax.lax.Precision.HIGHEST


def chunk_gated_delta(q, k, v, g, beta, initial_state, num_tokens, *, chunk_size=CHUNK_SIZE,
                      unroll: int | bool = 1):
    """See reference.chunk_gated_delta (same arguments and results); chunk_size a power of
    two (the tail is padded with identity tokens to a whole chunk)."""
    dot_dtype = matmul_dtype(v)
    T = q.shape[0]
    q, k, v, g, beta = _prepare(q, k, v, g, beta, num_tokens)
    q, k, v, g, beta = (x.reshape(-1, chunk_size, *x.shape[1:]) for x in
                        pad_to_chunks((q, k, v, g, beta), chunk_size))
    # [N, C, Hv, ...] -> [N, Hv, C, ...]: each chunk of each head is one batch of matmuls
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    g, beta = (x.transpose(0, 2, 1) for x in (g, beta))
    w, u, G = wy_terms(k, v, g, beta, dot_dtype)
    attn = dot("...ik,...jk->...ij", q, k, dot_dtype) * in_chunk_decay(G)
    decay_to_end = jnp.exp(G[..., -1:] - G)[..., None]
    terms = (w, u, attn, q * jnp.exp(G)[..., None], k * decay_to_end, jnp.exp(G[..., -1]))
    state, out = jax.lax.scan(lambda s, t: _carry_chunk(s, t, dot_dtype),
                              initial_state.astype(jnp.float32), terms, unroll=unroll)
    out = out.transpose(0, 2, 1, 3)  # [N, C, Hv, dv]
    return out.reshape(-1, *out.shape[2:])[:T], state


def matmul_dtype(v):
    """The dtype of the chunked forms' matmul operands: v's when it is a 16-bit float (a bf16
    model on the GPU), else float32 (at Precision.HIGHEST)."""
    return v.dtype if jnp.dtype(v.dtype).itemsize == 2 else jnp.dtype(jnp.float32)


def dot(spec: str, a, b, dtype):
    """einsum with float32 results: float32 operands at HIGHEST, others cast to `dtype`."""
    if jnp.dtype(dtype) == jnp.float32:
        return jnp.einsum(spec, a.astype(jnp.float32), b.astype(jnp.float32),
                          precision=_HIGHEST)
    return jnp.einsum(spec, a.astype(dtype), b.astype(dtype),
                      preferred_element_type=jnp.float32)


def pad_to_chunks(arrays, chunk_size: int):
    """Pad each array's leading (token) axis with zeros to a multiple of chunk_size."""
    pad = -arrays[0].shape[0] % chunk_size
    return [jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) for x in arrays]


def in_chunk_decay(G):
    """D [..., C, C]: exp(G_i - G_j) where j <= i, else 0 (never exp of a positive)."""
    C = G.shape[-1]
    is_past = jnp.tril(jnp.ones((C, C), bool))
    return jnp.exp(jnp.where(is_past, G[..., :, None] - G[..., None, :], -jnp.inf))


def wy_terms(k, v, g, beta, dot_dtype):
    """Each chunk's W [..., C, dk], U [..., C, dv] (float32) and G [..., C], from k [..., C,
    dk], v [..., C, dv], g and beta [..., C] in float32 (any leading axes). The triangular
    inverse stays in float32 whatever dot_dtype is."""
    C = g.shape[-1]
    G = jnp.cumsum(g, axis=-1)
    system = dot("...ik,...jk->...ij", k, k, dot_dtype) * beta[..., :, None] * in_chunk_decay(G)
    system = jnp.where(jnp.tril(jnp.ones((C, C), bool), -1), system, 0.0)
    inverse = wy_inverse(system)
    w = dot("...ij,...jk->...ik", inverse, k * (beta * jnp.exp(G))[..., None], dot_dtype)
    u = dot("...ij,...jv->...iv", inverse, v * beta[..., None], dot_dtype)
    return w, u, G


def wy_inverse(a):
    """(I + a)^-1 for a strictly lower-triangular a [..., n, n] (n a power of two), float32.

    Blockwise: [[X, 0], [Y, Z]]^-1 = [[X^-1, 0], [-Z^-1 Y X^-1, Z^-1]], applied to every pair
    of neighbouring diagonal blocks at once, from 1x1 blocks (inverse 1) up to the whole."""
    n = a.shape[-1]
    if n & (n - 1):
        raise ValueError(f"wy_inverse needs a power-of-two size, got {n}")
    lead = a.shape[:-2]
    inverse = jnp.ones((*lead, n, 1, 1), jnp.float32)  # [..., blocks, size, size]
    size = 1
    while size < n:
        pairs = n // (2 * size)
        blocks = a.reshape(*lead, pairs, 2, size, pairs, 2, size)
        # pair p's lower-left block: rows of its second half, columns of its first
        lower = jnp.diagonal(blocks[..., 1, :, :, 0, :], axis1=-4, axis2=-2)  # [.., s, s, p]
        lower = jnp.moveaxis(lower, -1, -3)  # [..., pairs, size, size]
        halves = inverse.reshape(*lead, pairs, 2, size, size)
        first, second = halves[..., 0, :, :], halves[..., 1, :, :]
        corner = -jnp.matmul(second, jnp.matmul(lower, first, precision=_HIGHEST),
                             precision=_HIGHEST)
        top = jnp.concatenate([first, jnp.zeros_like(first)], axis=-1)
        bottom = jnp.concatenate([corner, second], axis=-1)
        inverse = jnp.concatenate([top, bottom], axis=-2)
        size *= 2
    return inverse.reshape(*lead, n, n)


def _carry_chunk(state, terms, dot_dtype):
    """Pass the state [Hv, dk, dv] (float32) through one chunk; (new state, out [Hv, C, dv])."""
    w, u, attn, q_decayed, k_to_end, chunk_decay = terms
    new_values = u - dot("hck,hkv->hcv", w, state, dot_dtype)
    out = (dot("hck,hkv->hcv", q_decayed, state, dot_dtype)
           + dot("hij,hjv->hiv", attn, new_values, dot_dtype))
    state = (state * chunk_decay[:, None, None]
             + dot("hck,hcv->hkv", k_to_end, new_values, dot_dtype))
    return state, out


def chained_gated_delta(q, k, v, g, beta, states, depth):
    """B row tokens where row i continues the chain of the depth[i] rows before it (the
    speculative verify rows, model/ragged_batch.chain_depths), each chain starting from
    states[i] (equal along a chain: its slot's state). The chains are solved at once as one
    block-diagonal chunk in WY form, float32 at HIGHEST: no loop over chain positions.
    q, k [B, Hk, dk], v [B, Hv, dv], g, beta [B, Hv], states [B, Hv, dk, dv], depth int32 [B].
    Returns (out [B, Hv, dv], each row's state after it [B, Hv, dk, dv]), float32, as a
    gated_delta_step per row fed its predecessor's state would."""
    B = q.shape[0]
    f32 = jnp.float32
    q, k, v, g, beta = _prepare(q, k, v, g, beta, None)  # [B, Hv, ...]
    rows = jnp.arange(B)
    # same_chain[i, j]: row j is row i or one of its chain's earlier rows
    same_chain = (rows[None, :] <= rows[:, None]) & (rows[None, :] >= (rows - depth)[:, None])
    G = jnp.einsum("ij,jh->hi", same_chain.astype(f32), g, precision=_HIGHEST)  # [Hv, B]
    decay = jnp.exp(jnp.where(same_chain, G[:, :, None] - G[:, None, :], -jnp.inf))
    q, k, v = (x.transpose(1, 0, 2) for x in (q, k, v))  # [Hv, B, d]
    beta = beta.T
    size = 1 << max(B - 1, 0).bit_length()  # wy_inverse wants a power of two
    system = dot("hik,hjk->hij", k, k, f32) * beta[:, :, None] * decay
    system = jnp.where(rows[None, :] < rows[:, None], system, 0.0)
    system = jnp.pad(system, [(0, 0), (0, size - B), (0, size - B)])
    inverse = wy_inverse(system)[:, :B, :B]
    w = dot("hij,hjk->hik", inverse, k * (beta * jnp.exp(G))[..., None], f32)
    u = dot("hij,hjv->hiv", inverse, v * beta[..., None], f32)
    new_values = u - jnp.einsum("hbk,bhkv->hbv", w, states, precision=_HIGHEST)
    attn = dot("hik,hjk->hij", q, k, f32) * decay
    out = (jnp.einsum("hbk,bhkv->hbv", q * jnp.exp(G)[..., None], states, precision=_HIGHEST)
           + dot("hij,hjv->hiv", attn, new_values, f32))
    after = (states * jnp.exp(G).T[:, :, None, None]
             + jnp.einsum("hij,hjk,hjv->ihkv", decay, k, new_values, precision=_HIGHEST))
    return out.transpose(1, 0, 2), after
