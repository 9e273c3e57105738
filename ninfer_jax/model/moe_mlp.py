"""The sparse MoE MLP of qwen3_5_moe and qwen3_next layers: router, routed experts, shared expert.

The router's softmax runs over all E experts in float32; the top k are kept (renormalised to
sum to one when config.norm_topk_prob) and the routed experts (kernels/moe) combine with them.
The shared expert, when the model has one, is a SwiGLU MLP scaled by sigmoid(x @ shared_gate)
and added. Leaves: see model/config.py (router, experts_gate_up, experts_down, shared_*).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ninfer_jax.kernels import moe
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.layers import linear, swiglu_mlp


def moe_mlp(x, layer, config: ModelConfig):
    """x [N, H] -> [N, H]."""
    expert_ids, expert_weights = route(x, layer["router"], config)
    out = moe.routed_experts(x, expert_ids, expert_weights.astype(x.dtype),
                             layer["experts_gate_up"], layer["experts_down"])
    if "shared_w_gate" in layer:
        shared = swiglu_mlp(x, {"w_gate": layer["shared_w_gate"], "w_up": layer["shared_w_up"],
                                "w_down": layer["shared_w_down"]})
        gate = jax.nn.sigmoid(linear(x, layer["shared_gate"], out_dtype=jnp.float32))
        out = out + (gate * shared.astype(jnp.float32)).astype(x.dtype)
    return out


def route(x, router, config: ModelConfig):
    """The k experts of each token and their combine weights: (int32 [N, k], f32 [N, k])."""
    logits = linear(x, router, out_dtype=jnp.float32).astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    weights, ids = jax.lax.top_k(probs, config.num_experts_per_tok)
    if config.norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return ids.astype(jnp.int32), weights
