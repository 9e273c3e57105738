"""Routed MoE experts: the grouped (ragged_dot) and gathered paths against the dense per-expert
loop, including experts that no token picks and a token count below the expert count."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.kernels import moe
from ninfer_jax.kernels.moe import reference

NUM_EXPERTS, HIDDEN, WIDTH = 8, 24, 10


def routing(rng, num_tokens, top_k, *, skip_experts=()):
    """Distinct experts per token (as top-k gives), never one of `skip_experts`."""
    allowed = [e for e in range(NUM_EXPERTS) if e not in skip_experts]
    ids = np.stack([rng.choice(allowed, top_k, replace=False) for _ in range(num_tokens)])
    weights = rng.uniform(0.1, 1.0, (num_tokens, top_k))
    return jnp.asarray(ids, jnp.int32), jnp.asarray(weights, jnp.float32)


def expert_weights(rng):
    gate_up = rng.standard_normal((NUM_EXPERTS, HIDDEN, 2 * WIDTH)) * 0.3
    down = rng.standard_normal((NUM_EXPERTS, WIDTH, HIDDEN)) * 0.3
    return jnp.asarray(gate_up, jnp.float32), jnp.asarray(down, jnp.float32)


@pytest.mark.parametrize("path", ["grouped_experts", "gathered_experts", "routed_experts"])
@pytest.mark.parametrize("num_tokens,top_k", [(1, 2), (3, 2), (37, 3), (16, 1)])
def test_paths_match_the_dense_expert_loop(path, num_tokens, top_k):
    rng = np.random.default_rng(num_tokens * 10 + top_k)
    x = jnp.asarray(rng.standard_normal((num_tokens, HIDDEN)), jnp.float32)
    ids, weights = routing(rng, num_tokens, top_k, skip_experts=(2, 5))
    gate_up, down = expert_weights(rng)
    fn = moe.routed_experts if path == "routed_experts" else getattr(reference, path)
    with jax.default_matmul_precision("highest"):
        got = jax.jit(fn)(x, ids, weights, gate_up, down)
        expected = reference.dense_experts(x, ids, weights, gate_up, down)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=1e-5)


def test_dense_loop_is_a_weighted_sum_of_swiglu_experts():
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((2, HIDDEN)), jnp.float32)
    ids, weights = routing(rng, 2, 2)
    gate_up, down = expert_weights(rng)
    with jax.default_matmul_precision("highest"):
        got = np.asarray(reference.dense_experts(x, ids, weights, gate_up, down))
    for n in range(2):
        expected = np.zeros(HIDDEN)
        for j in range(2):
            e = int(ids[n, j])
            h = np.asarray(x[n]) @ np.asarray(gate_up[e])
            gate, up = h[:WIDTH], h[WIDTH:]
            expected += float(weights[n, j]) * ((gate / (1 + np.exp(-gate)) * up)
                                                @ np.asarray(down[e]))
        np.testing.assert_allclose(got[n], expected, atol=1e-5, rtol=1e-5)
