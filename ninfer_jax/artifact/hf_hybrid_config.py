"""The ModelConfig of a hybrid Qwen checkpoint (Qwen3.5, Qwen3.5/3.6-MoE, Qwen3-Next) read
from its Hugging Face config.json.

The multimodal wrappers (`Qwen3_5ForConditionalGeneration`, `Qwen3_5MoeForConditionalGeneration`)
keep the language model's fields under `text_config`; the text-only classes keep them at the top
level. Field by field, as transformers' configuration_qwen3_5 / _qwen3_5_moe / _qwen3_next read them:
- layer_types, else derived from full_attention_interval (default 4): layer i is full attention
  when (i + 1) % interval == 0;
- partial_rotary_factor inside rope_parameters (or at the top level), default 0.25; the mRoPE
  keys (mrope_section, mrope_interleaved) are dropped: text positions use the same index for
  the three mRoPE rows, which is plain partial RoPE;
- attention output gate: always on in these modules (q_proj holds query and gate per head)
  unless the config says attn_output_gate false;
- Qwen3-Next's decoder_sparse_step becomes mlp_only_layers (layers whose (i + 1) % step != 0);
  Qwen3.5-MoE always renormalises the top-k router weights;
- mtp_num_layers is what the checkpoint stores (mtp.layers.N tensors), not what the config
  advertises (mtp_num_hidden_layers / num_nextn_predict_layers): transformers drops mtp.* on
  save, so a re-saved checkpoint advertises a head it no longer has.
"""
from __future__ import annotations

import pathlib
from typing import Any

from ninfer_jax.errors import ArtifactError
from ninfer_jax.model.config import ModelConfig

HYBRID_ARCHITECTURES = {
    "Qwen3_5ForCausalLM": "qwen3_5", "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Qwen3NextForCausalLM": "qwen3_next"}
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields: `text_config` of a multimodal wrapper, else the top level."""
    return hf.get("text_config") or hf


def hybrid_model_config(hf: dict[str, Any], path: pathlib.Path, *, architecture: str,
                        mtp_layers: int) -> ModelConfig:
    text = text_config(hf)
    if text.get("attention_bias"):
        raise ArtifactError(path, "attention biases are not supported")
    heads = int(text["num_attention_heads"])
    layers = int(text["num_hidden_layers"])
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    partial = float(rope.pop("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)))
    # MRoPE matters only with a vision tower (the vision component needs it).
    mrope_section = tuple(rope.get("mrope_section") or ()) if hf.get("vision_config") else ()
    for key in _MROPE_KEYS:
        rope.pop(key, None)
    theta, scaling = rope_from(rope, text)
    tied = hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    try:
        return ModelConfig(
            architecture=architecture, vocab_size=int(text["vocab_size"]),
            hidden_size=int(text["hidden_size"]),
            intermediate_size=int(text.get("intermediate_size") or 0), num_layers=layers,
            num_heads=heads, num_kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)), rope_theta=theta,
            rope_scaling=scaling, tie_word_embeddings=bool(tied), qk_norm=True,
            max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
            layer_types=_layer_types(text, layers), partial_rotary_factor=partial,
            attn_output_gate=bool(text.get("attn_output_gate", True)),
            linear_num_key_heads=int(text["linear_num_key_heads"]),
            linear_num_value_heads=int(text["linear_num_value_heads"]),
            linear_key_head_dim=int(text["linear_key_head_dim"]),
            linear_value_head_dim=int(text["linear_value_head_dim"]),
            linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
            mtp_num_layers=mtp_layers, mrope_section=mrope_section,
            **_moe_fields(text, architecture, layers))
    except (KeyError, ValueError, TypeError) as exc:
        raise ArtifactError(path, f"incomplete or invalid config ({exc})") from None


def rope_from(parameters: dict[str, Any], hf: dict[str, Any]) -> tuple[float, dict | None]:
    """rope_theta and a non-default scaling dict from `rope_parameters` (newer configs, with
    rope_type "default" meaning no scaling) or `rope_theta` + `rope_scaling` (older ones)."""
    parameters = dict(parameters)
    theta = float(parameters.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    return theta, (parameters if parameters and kind != "default" else None)


def _layer_types(text: dict[str, Any], layers: int) -> tuple[str, ...]:
    if text.get("layer_types"):
        return tuple(text["layer_types"])
    interval = int(text.get("full_attention_interval", 4))
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(layers))


def _moe_fields(text: dict[str, Any], architecture: str, layers: int) -> dict[str, Any]:
    if architecture == "qwen3_5" or not text.get("num_experts"):
        return {}
    step = int(text.get("decoder_sparse_step", 1))
    dense = set(text.get("mlp_only_layers") or ()) | {i for i in range(layers) if (i + 1) % step}
    return {"num_experts": int(text["num_experts"]),
            "num_experts_per_tok": int(text["num_experts_per_tok"]),
            "moe_intermediate_size": int(text["moe_intermediate_size"]),
            "shared_expert_intermediate_size": int(text.get("shared_expert_intermediate_size", 0)),
            "norm_topk_prob": bool(text.get("norm_topk_prob", True)),
            "mlp_only_layers": tuple(sorted(dense))}
