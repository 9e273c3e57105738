"""What a step of a preset's shape must move and compute, for benchmarks/hybrid_bench.py.

Decode bytes: every weight byte the step needs, read once (projections, norms, the LM head,
B embedding rows), for MoE layers only the experts the rows select, plus the KV the attention
layers read and write (a sliding layer only its window) and the Gated DeltaNet state they read and write. Experts touched by B
rows are estimated as the expected count under uniform routing, E * (1 - (1 - k/E)^B): exactly
k at B = 1, which is what random weights give on average (the router sees random hidden
states). Prefill FLOPs: 2 per weight multiply-add for every token (MoE: the k routed experts
plus the shared one), causal attention, and the chunked delta rule's matmuls.
All sizes come from the config and the params tree as the runner holds it (its dtype).
"""
from __future__ import annotations

import jax
import numpy as np

from ninfer_jax.kernels.gated_delta import CHUNK_SIZE

EXPERT_LEAVES = ("experts_gate_up", "experts_up", "experts_down")  # experts_up: squared-ReLU (Nemotron-H)


def nbytes(leaf) -> int:
    return int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize


def tree_bytes(tree) -> int:
    return sum(nbytes(leaf) for leaf in jax.tree_util.tree_leaves(tree))


def expected_distinct_experts(num_experts: int, top_k: int, rows: int) -> float:
    """Experts that `rows` tokens select between them under uniform routing."""
    if rows <= 1:
        return float(min(top_k, num_experts) * rows)
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** rows)


def _layer_weight_bytes(layer: dict, experts_touched: float, num_experts: int) -> float:
    """Dense leaves whole, routed experts by the count touched; a shared expert folded in as
    expert E (fused_projections.fold_shared_expert) is touched by every step."""
    dense = sum(tree_bytes(leaf) for name, leaf in layer.items() if name not in EXPERT_LEAVES)
    experts = [layer[name] for name in EXPERT_LEAVES if name in layer]
    if not experts:
        return dense
    stored = jax.tree_util.tree_leaves(experts[0])[0].shape[0]
    per_expert = sum(tree_bytes(leaf) for leaf in experts) / stored
    touched = experts_touched + (stored - num_experts if experts_touched else 0)
    return dense + per_expert * touched


def decode_bytes(config, params, *, rows: int, context: int, kv_itemsize: int,
                 state_itemsize: int) -> dict:
    """Bytes one decode step of `rows` rows at `context` tokens must move, by part."""
    H = config.hidden_size
    embed_itemsize = np.dtype(params["embed"].dtype).itemsize
    touched = (expected_distinct_experts(config.num_experts, config.num_experts_per_tok, rows)
               if config.num_experts else 0.0)
    layers = sum(_layer_weight_bytes(layer, touched, config.num_experts)
                 for layer in params["layers"])
    head = tree_bytes(params["embed"] if config.tie_word_embeddings else params["lm_head"])
    embed_rows = 0 if config.tie_word_embeddings else rows * H * embed_itemsize
    weights = layers + head + embed_rows + tree_bytes(params["final_norm"])
    kv = 0
    for i in config.cache_layers():  # each its own heads and dims (Gemma's full layers)
        per_token = 2 * config.layer_kv_heads(i) * config.layer_head_dim(i) * kv_itemsize
        read = min(context, config.sliding_window) if config.is_sliding_layer(i) else context
        kv += rows * per_token * (read + 2)  # read context + 1, write 1
    state = 0
    if config.has_recurrent_state:  # Gated DeltaNet or Mamba-2 layers
        shapes = config.state_shapes()
        per_row = (4 * int(np.prod(shapes["recurrent"]))  # float32
                   + state_itemsize * int(np.prod(shapes["conv"])))
        state = len(config.state_layers()) * rows * 2 * per_row  # read and write
    experts = 0.0
    if config.num_experts:
        experts = sum(_layer_weight_bytes(layer, touched, config.num_experts)
                      - _layer_weight_bytes(layer, 0.0, config.num_experts)
                      for layer in params["layers"])
    return {"bytes": int(weights + kv + state), "weight_bytes": int(weights),
            "expert_bytes": int(experts), "kv_bytes": int(kv), "state_bytes": int(state),
            "experts_touched_per_layer": round(touched, 2)}


def active_matmul_params(config, params) -> int:
    """Weights one token multiplies through (embedding lookup and LM head excluded): MoE
    layers count their k routed experts, the router and the shared expert."""
    total = 0
    for layer in params["layers"]:
        for name, leaf in layer.items():
            size = int(np.prod(leaf.shape))
            if leaf.ndim < 2 or name == "conv":
                continue  # norms, per-head vectors, the depthwise conv (a few taps)
            if name in EXPERT_LEAVES:  # the k routed experts, plus a folded shared one
                stored = leaf.shape[0]
                size = size // stored * (config.num_experts_per_tok + stored - config.num_experts)
            total += size
    return total


def gdn_chunk_flops(config, num_tokens: int) -> float:
    """The chunked delta rule's matmuls over `num_tokens` tokens of one layer (per 64-token
    chunk and value head: K K^T and Q K^T, two triangular solves, and four state products)."""
    C, dk, dv = CHUNK_SIZE, config.linear_key_head_dim, config.linear_value_head_dim
    per_chunk = 2 * C * C * dk * 2 + C * C * (dk + dv) + 2 * C * C * dv + 6 * C * dk * dv
    return float(-(-num_tokens // C) * config.linear_num_value_heads * per_chunk)


def gdn_projection_params(config) -> int:
    """Weights of one Gated DeltaNet layer's projections (in_qkv, in_z, in_b, in_a, out)."""
    H, Hv, dv = config.hidden_size, config.linear_num_value_heads, config.linear_value_head_dim
    return H * (config.linear_conv_dim + 2 * Hv * dv + 2 * Hv)


def prefill_flops(config, params, num_tokens: int, num_chunks: int) -> dict:
    """FLOPs of prefilling `num_tokens` tokens from position 0 in `num_chunks` chunks."""
    kinds = config.layer_types or ("full_attention",) * config.num_layers
    num_attention = sum(kind != "linear_attention" for kind in kinds)
    weights = 2.0 * num_tokens * active_matmul_params(config, params)
    head = params["embed"].T if config.tie_word_embeddings else params["lm_head"]
    weights += 2.0 * num_chunks * int(np.prod(head.shape))  # one sampled row per chunk
    # causal: token t attends t + 1 keys, 2 FLOPs per multiply-add in QK^T and in PV
    attention = (num_attention * 4.0 * config.num_heads * config.head_dim
                 * num_tokens * (num_tokens + 1) / 2)
    gdn = (len(kinds) - num_attention) * gdn_chunk_flops(config, num_tokens) \
        if config.is_hybrid else 0.0
    return {"flops": weights + attention + gdn, "weight_flops": weights,
            "attention_flops": attention, "gdn_flops": gdn}
