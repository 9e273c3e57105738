"""What `ninfer inspect-artifact` says about a hybrid model beyond its tensors: the layer
pattern, the per-sequence recurrent state of the Gated DeltaNet layers, the KV bytes per
token of the full-attention layers, the MoE shape and the MTP head; and about a GLM MoE
model (`moe_summary`): the MoE shape with its grouped sigmoid router, attention and KV bytes.

Sizes assume the engine keeps KV and conv state in the artifact's float dtype (`embed`'s
format: f32 or bf16) and the delta-rule state in f32 (model/config.py state_shapes)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_jax.artifact.components import mtp_expected_shapes
from ninfer_jax.artifact.weights_io import human_bytes
from ninfer_jax.model.config import ModelConfig

_SHORT = {"linear_attention": "linear", "full_attention": "full"}
_FLOAT_BYTES = {"f32": 4, "bf16": 2}


def layer_pattern(layer_types: tuple[str, ...]) -> str:
    """The shortest repeating period as runs, e.g. `(3 linear, 1 full) x 16`."""
    n = len(layer_types)
    period = next(p for p in range(1, n + 1)
                  if n % p == 0 and layer_types == layer_types[:p] * (n // p))
    runs: list[list] = []
    for kind in layer_types[:period]:
        if runs and runs[-1][1] == kind:
            runs[-1][0] += 1
        else:
            runs.append([1, kind])
    text = ", ".join(f"{count} {_SHORT[kind]}" for count, kind in runs)
    return f"({text}) x {n // period}" if n // period > 1 else text


def hybrid_summary(config: ModelConfig, weight_formats: dict[str, str]) -> dict[str, Any]:
    """JSON-ready facts about a hybrid config (the report's `hybrid` entry)."""
    float_bytes = _FLOAT_BYTES.get(weight_formats.get("embed"), 2)
    types = config.layer_types
    num_linear, num_full = types.count("linear_attention"), types.count("full_attention")
    shapes = config.state_shapes()
    conv = int(np.prod(shapes["conv"])) * float_bytes
    recurrent = int(np.prod(shapes["recurrent"])) * 4
    kv_layer = 2 * config.num_kv_heads * config.head_dim * float_bytes
    return {
        "layers": {"linear_attention": num_linear, "full_attention": num_full,
                   "pattern": layer_pattern(types)},
        "state_bytes_per_sequence": {
            "conv_per_layer": conv, "recurrent_per_layer": recurrent,
            "conv_shape": list(shapes["conv"]), "recurrent_shape": list(shapes["recurrent"]),
            "total": num_linear * (conv + recurrent)},
        "kv_bytes_per_token": num_full * kv_layer,
        "attention": {"output_gate": config.attn_output_gate,
                      "rotary_dims": int(config.head_dim * config.partial_rotary_factor)},
        "moe": _moe(config),
        "mtp": _mtp(config, kv_layer),
    }


def _moe(config: ModelConfig) -> dict[str, Any] | None:
    if not config.num_experts:
        return None
    moe = {"experts": config.num_experts, "top_k": config.num_experts_per_tok,
           "expert_width": config.moe_intermediate_size,
           "shared_expert_width": config.shared_expert_intermediate_size,
           "renormalise_top_k": config.norm_topk_prob,
           "dense_layers": list(config.mlp_only_layers)}
    if config.is_glm:
        moe["router"] = {"scores": "sigmoid", "correction_bias": True,
                         "groups": config.num_expert_groups,
                         "top_groups": config.num_topk_groups,
                         "scaling": config.routed_scaling_factor}
    return moe


def moe_summary(config: ModelConfig, weight_formats: dict[str, str]) -> dict[str, Any]:
    """JSON-ready facts about a GLM MoE config (the report's `moe` entry)."""
    float_bytes = _FLOAT_BYTES.get(weight_formats.get("embed"), 2)
    return {"moe": _moe(config),
            "kv_bytes_per_token": config.num_layers * 2 * config.num_kv_heads
            * config.head_dim * float_bytes,
            "attention": {"biases": config.attention_bias, "qk_norm": config.qk_norm,
                          "rotary_dims": int(config.head_dim * config.partial_rotary_factor)}}


def format_moe(summary: dict[str, Any]) -> list[str]:
    """The readable lines of a `moe` entry."""
    moe, attention = summary["moe"], summary["attention"]
    router = moe["router"]
    return [
        _moe_line(moe) + f"; router sigmoid + correction bias, top-{router['top_groups']} of "
        f"{router['groups']} groups, scaling {router['scaling']}",
        f"KV/token      {human_bytes(summary['kv_bytes_per_token'])} "
        f"({summary['kv_bytes_per_token']:,} bytes)",
        f"attention     q/k/v biases {'on' if attention['biases'] else 'off'}, q/k norm "
        f"{'on' if attention['qk_norm'] else 'off'}, RoPE on {attention['rotary_dims']} dims "
        "per head"]


def _moe_line(moe: dict[str, Any]) -> str:
    return (f"MoE           {moe['experts']} experts, top-{moe['top_k']}, width "
            f"{moe['expert_width']}, shared expert width {moe['shared_expert_width']}"
            f"{', dense layers ' + str(moe['dense_layers']) if moe['dense_layers'] else ''}")


def _mtp(config: ModelConfig, kv_layer: int) -> dict[str, Any] | None:
    if not config.mtp_num_layers:
        return None
    shapes = mtp_expected_shapes(config)
    return {"layers": config.mtp_num_layers,
            "parameters": sum(int(np.prod(s)) for s in shapes.values()),
            "kv_bytes_per_token": config.mtp_num_layers * kv_layer}


def format_hybrid(summary: dict[str, Any]) -> list[str]:
    """The readable lines of a `hybrid` entry."""
    layers, state = summary["layers"], summary["state_bytes_per_sequence"]
    attention = summary["attention"]
    lines = [
        f"layer types   {layers['linear_attention']} linear_attention, "
        f"{layers['full_attention']} full_attention: {layers['pattern']}",
        f"state/seq     {human_bytes(state['total'])} ({state['total']:,} bytes): per linear layer "
        f"conv {state['conv_shape']} {human_bytes(state['conv_per_layer'])} + recurrent "
        f"{state['recurrent_shape']} f32 {human_bytes(state['recurrent_per_layer'])}",
        f"KV/token      {human_bytes(summary['kv_bytes_per_token'])} "
        f"({summary['kv_bytes_per_token']:,} bytes, full-attention layers only)",
        f"attention     output gate {'on' if attention['output_gate'] else 'off'}, "
        f"RoPE on {attention['rotary_dims']} dims per head",
    ]
    if summary["moe"]:
        lines.append(_moe_line(summary["moe"]))
    if summary["mtp"]:
        mtp = summary["mtp"]
        lines.append(f"MTP head      {mtp['layers']} layer(s), {mtp['parameters']:,} parameters, "
                     f"KV/token {human_bytes(mtp['kv_bytes_per_token'])} (mtp component)")
    return lines
