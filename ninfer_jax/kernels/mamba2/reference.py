"""Pure-jnp reference of Mamba-2's selective scan (SSD): the CPU path and the test oracle.

Per head h with state S [P, N] (float32) and per token t, a_t = dt_t * A_h (A_h < 0):
    S <- exp(a_t) S + dt_t x_t (x) B_t;    y_t = S C_t + D_h x_t
Three entry points, same argument conventions:
  recurrent_ssd   the per-token scan of one sequence (the oracle; T serial steps)
  chunk_ssd       the same result in chunks of CHUNK_SIZE tokens (prefill): inside a chunk the
                  scan is a masked, decayed C B^T product (attention-like, no loop); only the
                  chunk-to-chunk state update is sequential
  ssd_step        one token for each of R independent rows, each with its own state
Inputs: x [T, Hm, P], dt [T, Hm] (already softplus'd, biased and clamped), A [Hm],
B, C [T, G, N] (head h reads group h // (Hm / G), as transformers repeats them), D [Hm],
state [Hm, P, N]. Tokens t >= num_tokens are padding: their dt is zeroed, which makes them the
identity on the state (exp(0) S + 0), so the returned state is the one after the last real
token and a chunk may start from any earlier chunk's state; their outputs are unspecified.
Everything is computed in float32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

CHUNK_SIZE = 64
_HIGHEST = jax.lax.Precision.HIGHEST  # the state must not drift through TF32 products


def recurrent_ssd(x, dt, A, B, C, D, initial_state, num_tokens):
    """Token by token over one sequence. Returns (y [T, Hm, P] f32, final state f32)."""
    x, dt, B, C = _prepare(x, dt, B, C, num_tokens)

    def step(state, token):
        y, state = _update(state, *token, A.astype(jnp.float32), D.astype(jnp.float32))
        return state, y

    state, y = jax.lax.scan(step, initial_state.astype(jnp.float32), (x, dt, B, C))
    return y, state


def ssd_step(x, dt, A, B, C, D, states):
    """One token per row: x [R, Hm, P], dt [R, Hm], B, C [R, G, N], states [R, Hm, P, N].
    Returns (y [R, Hm, P] f32, new states [R, Hm, P, N] f32)."""
    x, dt, B, C = _prepare(x, dt, B, C, None)
    update = jax.vmap(_update, in_axes=(0, 0, 0, 0, 0, None, None))
    return update(states.astype(jnp.float32), x, dt, B, C, A.astype(jnp.float32),
                  D.astype(jnp.float32))


def chunk_ssd(x, dt, A, B, C, D, initial_state, num_tokens, *, chunk_size=CHUNK_SIZE,
              unroll: int | bool = 1):
    """Chunked form of recurrent_ssd (same arguments and results). T need not be a multiple
    of chunk_size: the tail is padded with identity tokens."""
    T = x.shape[0]
    x, dt, B, C = _prepare(x, dt, B, C, num_tokens)
    skip = D.astype(jnp.float32)[:, None] * x
    L = min(chunk_size, T)
    pad = -T % L
    x, dt, B, C = (jnp.pad(v, [(0, pad)] + [(0, 0)] * (v.ndim - 1)) for v in (x, dt, B, C))
    # [T', Hm, d] -> [chunks, Hm, L, d]: heads lead so each chunk is a batch of matmuls
    x, B, C = (v.reshape(-1, L, *v.shape[1:]).transpose(0, 2, 1, 3) for v in (x, B, C))
    dt = dt.reshape(-1, L, dt.shape[-1]).transpose(0, 2, 1)
    terms = _chunk_terms(x, dt, A.astype(jnp.float32), B, C)
    state, y = jax.lax.scan(_carry_chunk, initial_state.astype(jnp.float32), terms,
                            unroll=unroll)
    y = y.transpose(0, 2, 1, 3)  # [chunks, L, Hm, P]
    return y.reshape(-1, *y.shape[2:])[:T] + skip, state


def _prepare(x, dt, B, C, num_tokens):
    """float32 copies with groups repeated to heads and padding tokens neutralised."""
    repeat = x.shape[-2] // B.shape[-2]
    B, C = (jnp.repeat(v.astype(jnp.float32), repeat, axis=-2) for v in (B, C))
    x, dt = x.astype(jnp.float32), dt.astype(jnp.float32)
    if num_tokens is not None:
        dt = jnp.where((jnp.arange(x.shape[0]) < num_tokens)[:, None], dt, 0.0)
    return x, dt, B, C


def _update(state, x, dt, B, C, A, D):
    """One token for all heads: state [Hm, P, N], x [Hm, P], dt [Hm], B, C [Hm, N]."""
    state = (state * jnp.exp(dt * A)[:, None, None]
             + (dt[:, None] * x)[:, :, None] * B[:, None, :])
    y = jnp.einsum("hpn,hn->hp", state, C, precision=_HIGHEST)
    return y + D[:, None] * x, state


def _chunk_terms(x, dt, A, B, C):
    """Everything of each chunk that does not depend on the incoming state ([chunks, Hm, L,
    ...]). With G the in-chunk cumulative log decay (G_i = sum_{j<=i} dt_j A):
      within  y_i = sum_{j<=i} (C_i . B_j) exp(G_i - G_j) dt_j x_j   (from a zero state)
      reads   y_i += exp(G_i) S C_i                                  (the incoming state)
      writes  S' = exp(G_L) S + sum_j exp(G_L - G_j) dt_j x_j (x) B_j."""
    L = x.shape[-2]
    G = jnp.cumsum(dt * A[:, None], axis=-1)  # [chunks, Hm, L]
    is_past = jnp.tril(jnp.ones((L, L), bool))
    # exp only where j <= i: the masked entries would overflow (G_i - G_j > 0 for j > i)
    decay = jnp.exp(jnp.where(is_past, G[..., :, None] - G[..., None, :], -jnp.inf))
    scores = jnp.einsum("...in,...jn->...ij", C, B, precision=_HIGHEST) * decay
    x_dt = x * dt[..., None]
    within = jnp.einsum("...ij,...jp->...ip", scores, x_dt, precision=_HIGHEST)
    c_decayed = C * jnp.exp(G)[..., None]
    x_to_end = x_dt * jnp.exp(G[..., -1:] - G)[..., None]
    return within, c_decayed, x_to_end, B, jnp.exp(G[..., -1])


def _carry_chunk(state, terms):
    """Pass the state [Hm, P, N] through one chunk; returns (new state, y [Hm, L, P])."""
    within, c_decayed, x_to_end, B, chunk_decay = terms
    y = within + jnp.einsum("hln,hpn->hlp", c_decayed, state, precision=_HIGHEST)
    state = (state * chunk_decay[:, None, None]
             + jnp.einsum("hlp,hln->hpn", x_to_end, B, precision=_HIGHEST))
    return state, y
