"""What `ninfer inspect-artifact` says about a Nemotron-H model beyond its tensors (the report's
`nemotron` entry): the Mamba-2 / attention / MLP layer pattern, the Mamba-2 shape and its
per-sequence state (conv state in the artifact's float dtype, `embed`'s format; SSM state in
f32, model/config.py state_shapes), and the KV bytes per token of the attention layers."""
from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_jax.artifact.weights_io import human_bytes
from ninfer_jax.model.config import NEMOTRON_LAYER_TYPES, ModelConfig

_FLOAT_BYTES = {"f32": 4, "bf16": 2}
_LETTERS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}  # HF's hybrid_override_pattern


def nemotron_summary(config: ModelConfig, weight_formats: dict[str, str]) -> dict[str, Any]:
    float_bytes = _FLOAT_BYTES.get(weight_formats.get("embed"), 2)
    types = config.layer_types
    shapes = config.state_shapes()
    conv = int(np.prod(shapes["conv"])) * float_bytes
    ssm = int(np.prod(shapes["recurrent"])) * 4
    return {
        "layers": {kind: types.count(kind) for kind in NEMOTRON_LAYER_TYPES},
        "pattern": "".join(_LETTERS[kind] for kind in types),
        "mamba": {"heads": config.mamba_num_heads, "head_dim": config.mamba_head_dim,
                  "groups": config.mamba_num_groups, "state_size": config.mamba_state_size,
                  "conv_kernel": config.mamba_conv_kernel},
        "state_bytes_per_sequence": {
            "conv_per_layer": conv, "ssm_per_layer": ssm,
            "total": len(config.state_layers()) * (conv + ssm)},
        "kv_bytes_per_token": len(config.cache_layers()) * 2 * config.num_kv_heads
        * config.head_dim * float_bytes,
        **({"moe": {"experts": config.num_experts, "per_token": config.num_experts_per_tok,
                    "expert_width": config.moe_intermediate_size,
                    "shared_width": config.shared_expert_intermediate_size,
                    "groups": config.num_expert_groups, "topk_groups": config.num_topk_groups,
                    "routed_scaling_factor": config.routed_scaling_factor}}
           if config.num_experts else {}),
    }


def format_nemotron(summary: dict[str, Any]) -> list[str]:
    """The readable lines of a `nemotron` entry."""
    layers, mamba, state = summary["layers"], summary["mamba"], summary["state_bytes_per_sequence"]
    return [
        f"layer types   {layers['mamba']} mamba, {layers['attention']} attention, "
        f"{layers['mlp']} mlp, {layers['moe']} moe: {summary['pattern']}",
        f"mamba-2       {mamba['heads']} heads of {mamba['head_dim']}, {mamba['groups']} "
        f"groups of state {mamba['state_size']}, conv {mamba['conv_kernel']} taps",
        f"state/seq     {human_bytes(state['total'])} ({state['total']:,} bytes: conv "
        f"{state['conv_per_layer']:,} + SSM {state['ssm_per_layer']:,} per Mamba layer)",
        f"KV/token      {human_bytes(summary['kv_bytes_per_token'])} "
        f"({summary['kv_bytes_per_token']:,} bytes, attention layers only, no RoPE)",
        *([f"moe           {m['experts']} relu2 experts of {m['expert_width']}, top "
           f"{m['per_token']} (groups {m['topk_groups']} of {m['groups']}, scale "
           f"{m['routed_scaling_factor']}), shared expert of {m['shared_width']}"]
          if (m := summary.get("moe")) else [])]
