"""Speculative rejection sampling on the device, for drafters whose proposal q is a real
distribution (not one-hot), as pure functions.

For one verify row with target distribution p [V], a draft d drawn from q [V]:
    accept d when u < p(d) / q(d), u ~ U[0, 1)   (probability min(1, p(d) / q(d)))
    else draw from max(0, p - q) normalised       (the residual)
The committed token is then distributed exactly as p (Leviathan et al. 2023, Chen et al. 2023):
P(t) = q(t) min(1, p(t)/q(t)) + (1 - sum_s min(q(s), p(s))) (p(t) - q(t))+ / Z = p(t). The
residual never holds d after a rejection (a rejection needs p(d) < q(d)), so "the row's token
equals the draft" still means accepted, and the host's acceptance rule (engine/speculation.py
`num_accepted`) and the hybrid state settle (ragged_batch.last_accepted_rows) apply unchanged.
With q one-hot at d this is the rule the ngram and greedy-MTP drafts already get from plain
sampling: accept with probability p(d), else p without d.
Both draws take their randomness from `key`, which the caller derives from the row's seed
and output position (model/sampling.row_key), so a seeded round is reproducible.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ninfer_jax.model import sampling


def verify_draft(key, p, q, draft):
    """One row: p, q f32 [V] (normalised), draft int32 [] drawn from q. Returns the committed
    token int32 [] (the draft when accepted, else a residual draw)."""
    accept_key, residual_key = jax.random.split(key)
    p_d, q_d = p[draft], q[draft]
    accepted = jax.random.uniform(accept_key) * q_d < p_d
    residual = jnp.maximum(p - q, 0.0)
    # a residual of zero mass only follows p == q, where acceptance is certain
    logits = jnp.where(residual > 0, jnp.log(jnp.where(residual > 0, residual, 1.0)), -jnp.inf)
    fallback = jax.random.categorical(residual_key, logits)
    return jnp.where(accepted, draft, fallback).astype(jnp.int32)


def verify_drafts(keys, p, q, drafts):
    """verify_draft over rows: keys [B] (typed keys or uint32 [B, 2]), p, q [B, V],
    drafts [B]."""
    return jax.vmap(verify_draft)(keys, p, q, drafts)


# Drafts draw from their own stream: a draft for output position n must not share the key
# with which the verify row at n decides acceptance (the draw and the test would correlate).
DRAFT_STREAM = 0x6D7470  # "mtp"


def draft_key(seed_words, sample_index):
    """The key of a sampled draft that stands for output position `sample_index`."""
    return jax.random.fold_in(sampling.row_key(seed_words, sample_index), DRAFT_STREAM)


def draft_tokens(keys, q):
    """One draw per row from q [B, V] (rows whose q is one-hot get that token)."""
    logits = jnp.where(q > 0, jnp.log(jnp.where(q > 0, q, 1.0)), -jnp.inf)
    return jax.vmap(jax.random.categorical)(keys, logits).astype(jnp.int32)


def verify_rows(row_tokens, sampled, sampling_batch, p, draft_q, depth, feeds_draft):
    """The verify step's tokens with rejection sampling on the rows that feed a sampled
    draft: row_tokens [B] (row i+1's token is row i's draft), sampled [B] the plain draws,
    p [B, V] the rows' distributions, draft_q [B, K, V] the q each row's sequence drew its
    drafts from (indexed by the row's depth in its chain), feeds_draft bool [B]. Greedy
    rows keep their argmax (q one-hot: equality is the exact rule)."""
    B, K = draft_q.shape[0], draft_q.shape[1]
    q = draft_q[jnp.arange(B), jnp.clip(depth, 0, K - 1)]
    draft = jnp.concatenate([row_tokens[1:], jnp.zeros(1, row_tokens.dtype)])
    keys = jax.vmap(sampling.row_key)(sampling_batch.seed_words[1:],
                                      sampling_batch.sample_index[1:])
    verified = verify_drafts(keys, p, q, draft)
    use = feeds_draft & ~sampling_batch.is_greedy[1:] & (depth < K)
    return jnp.where(use, verified, sampled)
