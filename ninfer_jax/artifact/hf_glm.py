"""The ModelConfig of a GLM MoE checkpoint (`Glm4MoeForCausalLM`: GLM-4.5, 4.5-Air, 4.6, 4.7)
read from its Hugging Face config.json, as transformers' configuration_glm4_moe reads it.

- partial_rotary_factor inside rope_parameters or at the top level, default 0.5;
- first_k_dense_replace (default 1) becomes mlp_only_layers: layers 0..k-1 have a dense MLP;
- the shared experts are n_shared_experts of width moe_intermediate_size, run as one MLP of
  their summed width;
- n_group / topk_group / routed_scaling_factor / norm_topk_prob configure the router;
- the checkpoint's extra next-token-prediction layers (model.layers.L.. with L =
  num_hidden_layers, num_nextn_predict_layers of them) are not converted (see hf_hybrid.py).
The tensors themselves are mapped by hf_hybrid.py, whose per-expert stacking they share.
"""
from __future__ import annotations

import pathlib
from typing import Any

from ninfer_jax.artifact.hf_hybrid_config import rope_from
from ninfer_jax.errors import ArtifactError
from ninfer_jax.model.config import ModelConfig

GLM_ARCHITECTURES = {"Glm4MoeForCausalLM": "glm4_moe"}


def glm_model_config(hf: dict[str, Any], path: pathlib.Path) -> ModelConfig:
    if hf.get("hidden_act", "silu") != "silu":
        raise ArtifactError(path, f"hidden_act {hf['hidden_act']!r} is not supported (silu is)")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    partial = float(rope.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 0.5)))
    theta, scaling = rope_from(rope, hf)
    try:
        heads, layers = int(hf["num_attention_heads"]), int(hf["num_hidden_layers"])
        first_dense = min(int(hf.get("first_k_dense_replace", 1)), layers)
        moe_width = int(hf["moe_intermediate_size"])
        return ModelConfig(
            architecture="glm4_moe", vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]), intermediate_size=int(hf["intermediate_size"]),
            num_layers=layers, num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)), rope_theta=theta,
            rope_scaling=scaling, tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qk_norm=bool(hf.get("use_qk_norm", False)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 131072)),
            partial_rotary_factor=partial, attention_bias=bool(hf.get("attention_bias", False)),
            num_experts=int(hf["n_routed_experts"]),
            num_experts_per_tok=int(hf["num_experts_per_tok"]),
            moe_intermediate_size=moe_width,
            shared_expert_intermediate_size=moe_width * int(hf.get("n_shared_experts", 1)),
            norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
            mlp_only_layers=tuple(range(first_dense)),
            num_expert_groups=int(hf.get("n_group", 1)),
            num_topk_groups=int(hf.get("topk_group", 1)),
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)))
    except (KeyError, ValueError, TypeError) as exc:
        raise ArtifactError(path, f"incomplete or invalid config ({exc})") from None
