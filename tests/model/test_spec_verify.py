"""Speculative rejection sampling (model/spec_verify.py) with a drafter whose q is a real
distribution leaves the committed token distributed as the target's p: a chi-square test over
many seeded draws, with a control showing the test rejects a rule that skips the residual."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from ninfer_jax.model.spec_verify import verify_drafts

DRAWS = 200_000
P = np.array([0.30, 0.05, 0.20, 0.01, 0.14, 0.10, 0.15, 0.05])
Q = np.array([0.05, 0.30, 0.20, 0.15, 0.10, 0.01, 0.04, 0.15])  # over- and under-proposes


def committed(rule, seed: int = 0):
    keys = jax.random.split(jax.random.key_data(jax.random.key(seed)), DRAWS)
    draft_keys = jax.random.split(jax.random.key(seed + 1), DRAWS)
    drafts = jax.vmap(lambda k: jax.random.categorical(k, jnp.log(Q)))(draft_keys)
    p = jnp.broadcast_to(jnp.asarray(P, jnp.float32), (DRAWS, len(P)))
    q = jnp.broadcast_to(jnp.asarray(Q, jnp.float32), (DRAWS, len(Q)))
    return np.asarray(rule(keys, p, q, drafts)), np.asarray(drafts)


def chi_square_p_value(tokens) -> float:
    counts = np.bincount(tokens, minlength=len(P))
    return stats.chisquare(counts, DRAWS * P).pvalue


def test_committed_tokens_follow_the_target_distribution():
    tokens, drafts = committed(verify_drafts)
    assert chi_square_p_value(tokens) > 1e-3
    # acceptance is min(1, p/q) per draft: sum_t min(p_t, q_t) overall
    assert abs(np.mean(tokens == drafts) - np.minimum(P, Q).sum()) < 0.005
    again, _ = committed(verify_drafts)
    assert np.array_equal(tokens, again)  # seeded: the same keys give the same tokens


def test_the_chi_square_rejects_resampling_from_p_after_a_rejection():
    def without_residual(keys, p, q, drafts):
        def one(key, p, q, d):
            accept_key, draw_key = jax.random.split(key)
            accepted = jax.random.uniform(accept_key) * q[d] < p[d]
            return jnp.where(accepted, d, jax.random.categorical(draw_key, jnp.log(p)))
        return jax.vmap(one)(keys, p, q, drafts)

    tokens, _ = committed(without_residual)
    assert chi_square_p_value(tokens) < 1e-12
