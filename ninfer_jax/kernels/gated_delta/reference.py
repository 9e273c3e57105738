"""Pure-jnp reference of the gated delta rule (the CPU path and the test oracle).

The rule, per value head with state S [dk, dv] (float32), for each token t:
    S <- exp(g_t) S;   S <- S + k_t (x) beta_t (v_t - S^T k_t);   o_t = S^T q_t
Three entry points, same argument conventions:
  recurrent_gated_delta   the per-token scan of one sequence (the oracle; T steps)
  chunk_gated_delta       the same result in chunks of CHUNK_SIZE tokens (prefill): within a
                          chunk the rule is solved in WY/UT form, a few matmuls instead of a
                          serial loop; only the chunk-to-chunk state update is sequential
  gated_delta_step        one token for each of B independent rows, each with its own state
  gated_delta_rows        the same, each row's state read from and written to its slot of
                          the state array (the decode step; rows_kernel.py is its GPU twin)
  conv_gated_delta_rows   the decode rows from the layer's in_qkv output: the causal conv over
                          each row's slot window, SiLU, the heads split and L2-normalised
                          (split_heads), then gated_delta_rows (rows_kernel.py's fused twin)
Inputs: q, k [T, Hk, dk] (L2-normalised by the caller, q also scaled by dk^-0.5), v [T, Hv, dv],
g [T, Hv] the log decay (<= 0), beta [T, Hv]. Value head j reads key head j // (Hv / Hk), as
transformers repeats them. Tokens t >= num_tokens are padding: their g and beta are zeroed,
which makes them the identity on the state, so the returned state is the one after the last
real token; their outputs are unspecified. Everything is computed in float32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

CHUNK_SIZE = 64
DUMMY_SLOT = 0  # model/ragged_batch.DUMMY_STATE_SLOT: the state slot of padding rows
_HIGHEST = jax.lax.Precision.HIGHEST  # the state must not drift through TF32 products
L2_EPS = 1e-6  # as the reference implementation's l2norm


def recurrent_gated_delta(q, k, v, g, beta, initial_state, num_tokens):
    """Token by token over one sequence. initial_state [Hv, dk, dv]; num_tokens int32 [].
    Returns (out [T, Hv, dv] f32, final_state [Hv, dk, dv] f32)."""
    q, k, v, g, beta = _prepare(q, k, v, g, beta, num_tokens)

    def step(state, token):
        out, state = _update(state, *token)
        return state, out

    state, out = jax.lax.scan(step, initial_state.astype(jnp.float32), (q, k, v, g, beta))
    return out, state


def gated_delta_step(q, k, v, g, beta, states):
    """One token per row: q, k [B, Hk, dk], v [B, Hv, dv], g, beta [B, Hv], states
    [B, Hv, dk, dv]. Returns (out [B, Hv, dv] f32, new states [B, Hv, dk, dv] f32)."""
    q, k, v, g, beta = _prepare(q, k, v, g, beta, None)
    return jax.vmap(_update)(states.astype(jnp.float32), q, k, v, g, beta)


def gated_delta_rows(q, k, v, g, beta, recurrent, slots):
    """gated_delta_step for B rows whose states live in the slots of recurrent [S, Hv, dk, dv]
    (row i in slot slots[i]): (out [B, Hv, dv] f32, recurrent with each row's new state
    written back). Rows on the dummy slot 0 are padding: their outputs are zeros and they
    write nothing (slot 0 is only read). Real rows' slots must be distinct."""
    out, new_states = gated_delta_step(q, k, v, g, beta, recurrent[slots])
    real = slots != DUMMY_SLOT
    target = jnp.where(real, slots, recurrent.shape[0])  # past the end: dropped
    return (jnp.where(real[:, None, None], out, 0.0),
            recurrent.at[target].set(new_states.astype(recurrent.dtype), mode="drop"))


def conv_gated_delta_rows(mixed, conv_weight, conv, gates, recurrent, slots, *,
                          key_heads: int, decay=None):
    """Decode rows from the conv's inputs: mixed [B, >= D_c] (the in_qkv output, D_c = 2 Hk dk +
    Hv dv; columns past D_c are ignored, so a fused projection's output passes uncopied),
    conv_weight [K, D_c], conv [S, K-1, D_c] the slots' last K-1 inputs, gates f32
    [B, Hv, 2] (g, beta) or None: then mixed is the fused in_qkvzba output and the gates come
    from its b | a columns and decay = (A_log, dt_bias) (fused_gates), recurrent f32
    [S, Hv, dk, dv], slots int32 [B]. Returns (out f32 [B, Hv, dv], window [B, K-1, D_c] in
    conv's dtype: each row's last K-1 inputs after its token, for the caller to store at its
    slot, recurrent as gated_delta_rows leaves it)."""
    if gates is None:
        gates = fused_gates(mixed, decay, conv_dim=conv_weight.shape[1],
                            value_heads=recurrent.shape[1], value_head_dim=recurrent.shape[3])
    q, k, v, window = conv_rows_heads(mixed, conv_weight, conv, slots, key_heads=key_heads,
                                      head_dims=recurrent.shape[2:])
    out, recurrent = gated_delta_rows(q, k, v, gates[..., 0], gates[..., 1], recurrent, slots)
    return out, window, recurrent


def decay_gates(b, a, A_log, dt_bias):
    """The in_b and in_a products b, a [N, Hv] with the layer's A_log, dt_bias [Hv] -> gates
    f32 [N, Hv, 2]: the log decay g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b)
    (one array: one small fusion, not two)."""
    beta = jax.nn.sigmoid(b.astype(jnp.float32))
    g = -jnp.exp(A_log.astype(jnp.float32)) * jax.nn.softplus(
        a.astype(jnp.float32) + dt_bias.astype(jnp.float32))
    return jnp.stack([g, beta], axis=-1)


def fused_gates(projected, decay, *, conv_dim: int, value_heads: int, value_head_dim: int):
    """decay_gates of rows of the fused in_qkvzba output [N, D_c + Hv dv + 2 Hv] (q | k | v,
    z, b, a), decay = (A_log, dt_bias)."""
    at = conv_dim + value_heads * value_head_dim
    return decay_gates(projected[:, at:at + value_heads],
                       projected[:, at + value_heads:at + 2 * value_heads], *decay)


def conv_rows_heads(mixed, conv_weight, conv, slots, *, key_heads: int,
                    head_dims: tuple[int, int]):
    """The conv, SiLU and head split of conv_gated_delta_rows: (q, k, v as split_heads gives
    them, the rows' new windows [B, K-1, D_c] in conv's dtype)."""
    mixed = mixed[:, :conv_weight.shape[1]]
    window = jnp.concatenate([conv[slots].astype(mixed.dtype), mixed[:, None]], axis=1)
    conv_out = jnp.einsum("rkc,kc->rc", window.astype(jnp.float32),
                          conv_weight.astype(jnp.float32))
    q, k, v = split_heads(jax.nn.silu(conv_out).astype(mixed.dtype), key_heads, *head_dims)
    return q, k, v, window[:, 1:].astype(conv.dtype)


def split_heads(x, key_heads: int, key_head_dim: int, value_head_dim: int):
    """Conv outputs [N, D_c] -> q, k [N, Hk, dk] (f32, L2-normalised, q scaled by dk^-0.5)
    and v [N, Hv, dv] (x's dtype; Hv dv = D_c - 2 Hk dk)."""
    N, key_dim = x.shape[0], key_heads * key_head_dim
    q = l2_normalised(x[:, :key_dim].reshape(N, key_heads, key_head_dim)) * key_head_dim ** -0.5
    k = l2_normalised(x[:, key_dim:2 * key_dim].reshape(N, key_heads, key_head_dim))
    return q, k, x[:, 2 * key_dim:].reshape(N, -1, value_head_dim)


def l2_normalised(x):
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + L2_EPS)


def chunk_gated_delta(q, k, v, g, beta, initial_state, num_tokens, *, chunk_size=CHUNK_SIZE,
                      unroll: int | bool = 1):
    """Chunked form of recurrent_gated_delta (same arguments and results). T need not be a
    multiple of chunk_size: the tail is padded with identity tokens. `unroll` is the
    chunk-to-chunk scan's (lax.scan): on a GPU every iteration of a rolled XLA loop costs a
    host round trip, which benchmarks/hybrid_bench.py weighs against unrolling."""
    T = q.shape[0]
    q, k, v, g, beta = _prepare(q, k, v, g, beta, num_tokens)
    C = min(chunk_size, T)
    pad = -T % C
    q, k, v, g, beta = (jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
                        for x in (q, k, v, g, beta))
    # [T', Hv, d] -> [N chunks, Hv, C, d]: heads lead so each chunk is a batch of matmuls
    q, k, v = (x.reshape(-1, C, *x.shape[1:]).transpose(0, 2, 1, 3) for x in (q, k, v))
    g, beta = (x.reshape(-1, C, x.shape[-1]).transpose(0, 2, 1) for x in (g, beta))
    terms = _chunk_terms(q, k, v, g, beta)
    state, out = jax.lax.scan(_carry_chunk, initial_state.astype(jnp.float32), terms,
                              unroll=unroll)
    out = out.transpose(0, 2, 1, 3)  # [N, C, Hv, dv]
    return out.reshape(-1, *out.shape[2:])[:T], state


def _prepare(q, k, v, g, beta, num_tokens):
    """float32 copies with key heads repeated to value heads and padding tokens neutralised."""
    repeat = v.shape[-2] // k.shape[-2]
    q, k = (jnp.repeat(x.astype(jnp.float32), repeat, axis=-2) for x in (q, k))
    v, g, beta = (x.astype(jnp.float32) for x in (v, g, beta))
    if num_tokens is not None:
        is_real = (jnp.arange(q.shape[0]) < num_tokens)[:, None]
        g, beta = jnp.where(is_real, g, 0.0), jnp.where(is_real, beta, 0.0)
    return q, k, v, g, beta


def _update(state, q, k, v, g, beta):
    """One token of the rule for all heads: state [Hv, dk, dv], q/k [Hv, dk], v [Hv, dv]."""
    state = state * jnp.exp(g)[:, None, None]
    predicted = jnp.einsum("hkv,hk->hv", state, k, precision=_HIGHEST)
    correction = (v - predicted) * beta[:, None]
    state = state + k[:, :, None] * correction[:, None, :]
    return jnp.einsum("hkv,hk->hv", state, q, precision=_HIGHEST), state


def _chunk_terms(q, k, v, g, beta):
    """Everything of each chunk that does not depend on the incoming state ([N, Hv, C, ...]).

    With G the in-chunk cumulative log decay and D_ij = exp(G_i - G_j) for j <= i, the chunk's
    writes solve (I + L) U = beta V and (I + L) W = beta K e^G, L = strict_lower(beta K K^T D):
    U are the values the chunk writes from a zero state, W how much each write reads of the
    incoming state. The solves are unit lower-triangular."""
    C = q.shape[-2]
    G = jnp.cumsum(g, axis=-1)  # [N, Hv, C]
    is_past = jnp.tril(jnp.ones((C, C), bool))
    # exp only where j <= i: the masked entries would overflow (G_i - G_j > 0 for j > i)
    decay = jnp.exp(jnp.where(is_past, G[..., :, None] - G[..., None, :], -jnp.inf))
    k_beta = k * beta[..., None]
    system = jnp.einsum("...ik,...jk->...ij", k_beta, k, precision=_HIGHEST) * decay
    system = jnp.where(jnp.tril(is_past, -1), system, 0.0) + jnp.eye(C)
    def solve(b):
        return jax.lax.linalg.triangular_solve(system, b, left_side=True, lower=True,
                                               unit_diagonal=True)

    values = solve(v * beta[..., None])  # U [N, Hv, C, dv]
    reads = solve(k_beta * jnp.exp(G)[..., None])  # W [N, Hv, C, dk]
    attn = jnp.einsum("...ik,...jk->...ij", q, k, precision=_HIGHEST) * decay
    q_decayed = q * jnp.exp(G)[..., None]
    k_to_end = k * jnp.exp(G[..., -1:] - G)[..., None]
    return values, reads, attn, q_decayed, k_to_end, jnp.exp(G[..., -1])


def _carry_chunk(state, terms):
    """Pass the state [Hv, dk, dv] through one chunk; returns (new state, out [Hv, C, dv])."""
    values, reads, attn, q_decayed, k_to_end, chunk_decay = terms
    new_values = values - jnp.einsum("hck,hkv->hcv", reads, state, precision=_HIGHEST)
    out = (jnp.einsum("hck,hkv->hcv", q_decayed, state, precision=_HIGHEST)
           + jnp.einsum("hij,hjv->hiv", attn, new_values, precision=_HIGHEST))
    state = (state * chunk_decay[:, None, None]
             + jnp.einsum("hck,hcv->hkv", k_to_end, new_values, precision=_HIGHEST))
    return state, out
