"""The sparse MoE MLP: router, routed experts (kernels/moe), shared expert.

Two routers. qwen3_5_moe / qwen3_next: a softmax over all E experts in float32, the top k kept
(renormalised to sum to one when config.norm_topk_prob), and a shared expert scaled by
sigmoid(x @ shared_gate). glm4_moe (DeepSeek-V3 style): sigmoid scores; the choice adds the
learned `router_bias` (e_score_correction_bias) and is restricted to the num_topk_groups best of
num_expert_groups groups (a group scores the sum of its two best experts); the combine weights
are the chosen experts' unbiased scores (renormalised when norm_topk_prob) times
routed_scaling_factor, and the shared experts are added ungated.
Leaves: see model/config.py (router, router_bias, experts_gate_up, experts_down, shared_*);
on one device the runner joins router | shared_gate into router_shared_gate and
shared_w_gate | shared_w_up into shared_w_gate_up (model/fused_projections.py), and with its
shared-expert fold the shared expert becomes expert E of the routed tensors: every token then
takes it as a (k+1)-th assignment weighted by its sigmoid gate.
Under expert parallelism the routed experts are experts_gate_up_ep / experts_down_ep, split by
expert index over the tensor-parallel mesh (model/tensor_parallel.py, `expert_parallel`).

Padding rows (`live` False: ragged_batch.live_rows) choose no experts of their own: they take
the first live row's experts with zero combine weights, so a step loads exactly the experts
its live rows picked (a lone decode row padded to two rows on the GPU would otherwise read
about k more experts per layer) and the kernels skip their zero-weight assignments. Their
routed output is zero; live rows are computed exactly as without them.
With norm_topk_prob the softmax router's tail (top k, weights, padding rows, the folded shared
expert's column) is kernels/moe/routing.py's, built from the same pieces as here; on a GPU
with its switch on it is one kernel, which reads the router | shared_gate product unsplit.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ninfer_jax.kernels import moe
from ninfer_jax.kernels.moe.routing import (top_k_softmax, with_shared_expert,
                                            without_padding_experts)
from ninfer_jax.model import tensor_parallel
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.layers import linear, split_columns, swiglu_mlp

SHARED_MLP_LEAVES = ("shared_w_gate", "shared_w_up", "shared_w_gate_up", "shared_w_down")


def moe_mlp(x, layer, config: ModelConfig, mesh=None, live=None):
    """x [N, H] -> [N, H]. `mesh`: the tensor-parallel mesh, needed when the layer's experts
    are split by expert index (the `_ep` leaves). `live` bool [N] or None (all live): rows
    that are real tokens; the others select no experts (see the module docstring)."""
    if config.is_glm:
        expert_ids, expert_weights = route_grouped_sigmoid(x, layer, config)
        if live is not None:
            expert_ids, expert_weights = without_padding_experts(expert_ids, expert_weights,
                                                                 live)
        shared_logit = None
    else:
        expert_ids, expert_weights, shared_logit = route_softmax(x, layer, config, live)
    if "experts_gate_up_ep" in layer:
        routed = tensor_parallel.expert_parallel(moe.routed_experts, mesh)
        experts = layer["experts_gate_up_ep"], layer["experts_down_ep"]
    else:
        routed = moe.routed_experts
        experts = layer["experts_gate_up"], layer["experts_down"]
    out = routed(x, expert_ids, expert_weights.astype(x.dtype), *experts)
    if "shared_w_down" in layer:
        shared = swiglu_mlp(x, {name.removeprefix("shared_"): leaf for name, leaf in layer.items()
                                if name in SHARED_MLP_LEAVES})
        if "shared_gate" in layer:
            shared_logit = linear(x, layer["shared_gate"], out_dtype=jnp.float32)
        if shared_logit is not None:
            gate = jax.nn.sigmoid(shared_logit.astype(jnp.float32))
            shared = (gate * shared.astype(jnp.float32)).astype(x.dtype)
        out = out + shared
    return out


def is_folded(layer, config: ModelConfig) -> bool:
    """Whether the layer's routed tensors end with its shared expert (one more than E)."""
    return ("experts_gate_up" in layer and not isinstance(layer["experts_gate_up"], dict)
            and layer["experts_gate_up"].shape[0] == config.num_experts + 1)


def route_softmax(x, layer, config: ModelConfig, live=None):
    """The softmax router's (expert_ids int32 [N, k'], expert_weights [N, k'] (f32, or x's
    dtype from the kernel), shared_logit f32 [N, 1] or None): padding rows' experts
    replaced and, when the layer
    folds its shared expert, its (k+1)-th column (k' = k + 1); shared_logit is the fused
    router_shared_gate's last column, for an unfolded shared expert's gate."""
    E, folded = config.num_experts, is_folded(layer, config)
    shared_logit = None
    if "router_shared_gate" in layer:  # one product for both (model/fused_projections.py)
        logits = linear(x, layer["router_shared_gate"], out_dtype=jnp.float32)
        logits = logits.astype(jnp.float32)
        router_logits, shared_logit = split_columns(logits, (E, 1))
    else:
        logits = router_logits = linear(x, layer["router"],
                                        out_dtype=jnp.float32).astype(jnp.float32)
    if config.norm_topk_prob and moe.uses_router_kernel():
        # The whole tail in one kernel, reading the fused product as it is (kernels/moe).
        if folded and shared_logit is None:
            logits = jnp.concatenate(
                [logits, linear(x, layer["shared_gate"], out_dtype=jnp.float32)], axis=-1)
        expert_ids, expert_weights = moe.softmax_top_experts(
            logits, live, num_experts=E, top_k=config.num_experts_per_tok,
            shared_expert=folded, weights_dtype=x.dtype)
        return expert_ids, expert_weights, shared_logit
    # routing.reference_softmax_top_experts spelled out, so that top_experts also serves
    # the router without norm_topk_prob
    expert_ids, expert_weights = top_experts(router_logits, config)
    if live is not None:
        expert_ids, expert_weights = without_padding_experts(expert_ids, expert_weights, live)
    if folded:  # the shared expert is expert E (fused_projections)
        if shared_logit is None:
            shared_logit = linear(x, layer["shared_gate"], out_dtype=jnp.float32)
        expert_ids, expert_weights = with_shared_expert(expert_ids, expert_weights,
                                                        shared_logit, live, E)
    return expert_ids, expert_weights, shared_logit


def top_experts(logits, config: ModelConfig):
    """The k experts of each token and their combine weights from the router's f32 logits
    [N, E]: (int32 [N, k], f32 [N, k])."""
    if config.norm_topk_prob:
        return top_k_softmax(logits, config.num_experts_per_tok)
    weights, ids = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), config.num_experts_per_tok)
    return ids.astype(jnp.int32), weights


def route_grouped_sigmoid(x, layer, config: ModelConfig):
    """glm4_moe's router (see the module docstring), also Nemotron 3's MoE layers'
    (model/nemotron_h.py): (int32 [N, k], f32 [N, k])."""
    N, E, G = x.shape[0], config.num_experts, config.num_expert_groups
    logits = linear(x.astype(jnp.float32), layer["router"].astype(jnp.float32),
                    out_dtype=jnp.float32)
    scores = jax.nn.sigmoid(logits.astype(jnp.float32))
    biased = scores + layer["router_bias"].astype(jnp.float32)
    if G > 1:
        group_scores = jnp.sum(jax.lax.top_k(biased.reshape(N, G, E // G), 2)[0], axis=-1)
        _, best_groups = jax.lax.top_k(group_scores, config.num_topk_groups)
        in_best = jnp.zeros((N, G), bool).at[jnp.arange(N)[:, None], best_groups].set(True)
        biased = jnp.where(jnp.repeat(in_best, E // G, axis=-1), biased, -jnp.inf)
    _, ids = jax.lax.top_k(biased, config.num_experts_per_tok)
    weights = jnp.take_along_axis(scores, ids, axis=-1)
    if config.norm_topk_prob:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return ids.astype(jnp.int32), weights * config.routed_scaling_factor
