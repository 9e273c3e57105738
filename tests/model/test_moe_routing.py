"""moe_mlp.top_experts: with norm_topk_prob the k experts and weights come from the k logits
alone; they must be those of the full softmax, kept top k and renormalised (transformers)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.model.moe_mlp import top_experts


@pytest.mark.parametrize("normalise", [True, False])
def test_top_experts_equal_the_softmax_then_top_k(normalise):
    config = dataclasses.replace(PRESETS["qwen3.6-35b-a3b"].config, norm_topk_prob=normalise)
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((64, config.num_experts)).astype(np.float32) * 3
    logits[1] = logits[0] + 40.0  # a shifted row: the same choice and weights
    ids, weights = jax.jit(top_experts, static_argnums=1)(jnp.asarray(logits), config)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want_ids = np.argsort(-probs, axis=-1, kind="stable")[:, :config.num_experts_per_tok]
    want = np.take_along_axis(probs, want_ids, axis=-1)
    if normalise:
        want = want / want.sum(-1, keepdims=True)
    np.testing.assert_array_equal(np.asarray(ids), want_ids)
    np.testing.assert_allclose(np.asarray(weights), want, rtol=2e-6, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(ids)[1], np.asarray(ids)[0])
