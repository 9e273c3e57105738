"""Gemma 4 checkpoints (`Gemma4ForCausalLM`, and the text model of
`Gemma4ForConditionalGeneration`) -> our config and params tree, as transformers'
configuration_gemma4 / modeling_gemma4 read them.

Config: the full layers' head dim and kv heads come from `per_layer_config` (what
transformers writes) or from `global_head_dim` (default 512) / `num_global_key_value_heads`
(used only with attention_k_eq_v), as published configs give them; rope_parameters holds one
entry per layer type (the full layers' "proportional" RoPE with its partial_rotary_factor).
Refused: MoE blocks (enable_moe_block), attention biases, bidirectional attention, an
activation other than gelu_pytorch_tanh, RoPE scaling factors.
Tensors: the multimodal wrapper's `model.language_model.` prefix is read as `model.`; the
vision and audio towers and their embedders are skipped (the text model only), as are the
k/v projections a checkpoint may still hold for KV-shared layers (transformers ignores them).
"""
from __future__ import annotations

import pathlib
from typing import Any

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.artifact.hf_hybrid_config import text_config
from ninfer_jax.errors import ArtifactError
from ninfer_jax.model.config import ModelConfig

GEMMA_ARCHITECTURES = {"Gemma4ForCausalLM": "gemma4", "Gemma4ForConditionalGeneration": "gemma4"}
LAYER_TENSORS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attn_norm",
    "pre_feedforward_layernorm": "mlp_norm", "post_feedforward_layernorm": "post_mlp_norm",
    "layer_scalar": "layer_scalar", "self_attn.q_proj": "wq", "self_attn.k_proj": "wk",
    "self_attn.v_proj": "wv", "self_attn.o_proj": "wo", "self_attn.q_norm": "q_norm",
    "self_attn.k_norm": "k_norm", "mlp.gate_proj": "w_gate", "mlp.up_proj": "w_up",
    "mlp.down_proj": "w_down", "per_layer_input_gate": "ple_gate",
    "per_layer_projection": "ple_proj", "post_per_layer_input_norm": "ple_norm"}
GLOBAL_TENSORS = {"model.embed_tokens": "embed", "model.norm": "final_norm",
                  "model.embed_tokens_per_layer": "ple_embed",
                  "model.per_layer_model_projection": "ple_model_proj",
                  "model.per_layer_projection_norm": "ple_proj_norm", "lm_head": None}
NOT_TEXT = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
            "model.embed_audio.")
UNTRANSPOSED = ("embed", "ple_embed")


def gemma_model_config(hf: dict[str, Any], path: pathlib.Path) -> ModelConfig:
    text = text_config(hf)
    _refuse_unsupported(text, path)
    try:
        layers, types = int(text["num_hidden_layers"]), list(text["layer_types"])
        rope = text.get("rope_parameters") or {}
        sliding, full = rope.get("sliding_attention", {}), rope.get("full_attention", {})
        head_dim, kv_heads = int(text["head_dim"]), int(text["num_key_value_heads"])
        global_dim, global_kv = _full_layer_shape(text, types, head_dim, kv_heads)
        P = int(text.get("hidden_size_per_layer_input") or 0)
        return ModelConfig(
            architecture="gemma4", vocab_size=int(text["vocab_size"]),
            hidden_size=int(text["hidden_size"]),
            intermediate_size=int(text["intermediate_size"]), num_layers=layers,
            num_heads=int(text["num_attention_heads"]), num_kv_heads=kv_heads,
            head_dim=head_dim, rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(sliding.get("rope_theta", 10000.0)),
            tie_word_embeddings=bool(text.get("tie_word_embeddings",
                                              hf.get("tie_word_embeddings", True))),
            max_position_embeddings=int(text.get("max_position_embeddings", 131072)),
            layer_types=tuple(types), sliding_window=int(text.get("sliding_window", 512)),
            global_head_dim=global_dim, global_num_kv_heads=global_kv,
            global_rope_theta=float(full.get("rope_theta", 1e6)),
            partial_rotary_factor=float(full.get("partial_rotary_factor", 1.0)),
            attention_k_eq_v=bool(text.get("attention_k_eq_v", False)),
            final_logit_softcapping=float(text.get("final_logit_softcapping") or 0.0),
            hidden_size_per_layer_input=P,
            vocab_size_per_layer_input=int(text.get("vocab_size_per_layer_input") or 0) if P
            else 0,
            num_kv_shared_layers=int(text.get("num_kv_shared_layers") or 0),
            use_double_wide_mlp=bool(text.get("use_double_wide_mlp", False)))
    except (KeyError, ValueError, TypeError) as exc:
        raise ArtifactError(path, f"incomplete or invalid config ({exc})") from None


def _refuse_unsupported(text: dict, path: pathlib.Path) -> None:
    if text.get("enable_moe_block"):
        raise ArtifactError(path, "Gemma 4 MoE blocks (enable_moe_block) are not supported")
    if text.get("attention_bias"):
        raise ArtifactError(path, "attention biases are not supported")
    if text.get("use_bidirectional_attention") == "all":
        raise ArtifactError(path, "bidirectional attention is not supported")
    if text.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ArtifactError(path, f"hidden_activation {text['hidden_activation']!r} is not "
                                  "supported (gelu_pytorch_tanh is)")
    for kind, rope in (text.get("rope_parameters") or {}).items():
        if float((rope or {}).get("factor", 1.0)) != 1.0:
            raise ArtifactError(path, f"RoPE scaling of {kind} layers is not supported")


def _full_layer_shape(text: dict, types: list, head_dim: int, kv_heads: int) -> tuple[int, int]:
    """(head dim, kv heads) of the full-attention layers."""
    per_layer = text.get("per_layer_config") or {}
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if per_layer and full:
        entry = per_layer.get(str(full[0])) or per_layer.get(full[0]) or {}
        return int(entry.get("head_dim", head_dim)), int(entry.get("num_key_value_heads",
                                                                   kv_heads))
    global_kv = text.get("num_global_key_value_heads") if text.get("attention_k_eq_v") else None
    return int(text.get("global_head_dim", 512)), int(global_kv or kv_heads)


def gemma_params(sources: list, config: ModelConfig, dtype: str,
                 progress: common.ProgressFn | None) -> dict:
    """The params tree (model/config.py) of a checkpoint's text model."""
    def layout(name, array):
        transposed = array.ndim == 2 and name.rsplit(".", 1)[-1] not in UNTRANSPOSED
        return array.T if transposed else array

    return common.collect_params(sources, config, dtype, progress,
                                 lambda file, hf_name: params_name(file.path, hf_name, config),
                                 layout)


def params_name(path: pathlib.Path, hf_name: str, config: ModelConfig) -> str | None:
    """Our name of a checkpoint tensor, or None for one the text model does not use."""
    if hf_name.startswith("model.language_model."):
        hf_name = "model." + hf_name.removeprefix("model.language_model.")
    if hf_name.startswith(NOT_TEXT) or hf_name.endswith("inv_freq"):
        return None
    base = hf_name.removesuffix(".weight")
    if base in GLOBAL_TENSORS:
        if base == "lm_head" and not config.tie_word_embeddings:
            return "lm_head"
        return GLOBAL_TENSORS[base]
    parts = base.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in LAYER_TENSORS:
        index, leaf = int(parts[2]), LAYER_TENSORS[parts[3]]
        if leaf in ("wk", "wv", "k_norm") and config.kv_source_layer(index) != index:
            return None  # a KV-shared layer reads another layer's cache
        return f"layers.{index}.{leaf}"
    raise ArtifactError(path, f"unsupported tensor {hf_name!r}")
