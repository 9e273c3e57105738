"""Nemotron-H checkpoints (`NemotronHForCausalLM`) -> our config and params tree, as
transformers' configuration_nemotron_h / modeling_nemotron_h read them.

Config: the layer pattern comes from `layers_block_type` (transformers' names) or the
published `hybrid_override_pattern` ("M" Mamba-2, "*" attention, "-" MLP); the attention head
dim from `head_dim` or the published `attention_head_dim`; the Mamba-2 fields from their
transformers names or the published `mamba_*` aliases (n_groups / mamba_n_groups, conv_kernel /
mamba_d_conv, time_step_limit / mamba_dt_limit). Refused: MoE layers ("E"), an MLP activation
other than relu2, biases on the Mamba projections or the MLP, a conv without bias, attention
biases (transformers builds its attention without them), MTP layers.
Tensors: `backbone.` (published checkpoints) or `model.` prefixes; conv1d.weight
[conv_dim, 1, K] is stored as conv [K, conv_dim]; projections are transposed.
"""
from __future__ import annotations

import math
import pathlib
from typing import Any

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.errors import ArtifactError
from ninfer_jax.model.config import ModelConfig

NEMOTRON_ARCHITECTURES = {"NemotronHForCausalLM": "nemotron_h"}
PATTERN_TYPES = {"M": "mamba", "*": "attention", "-": "mlp"}
HF_LAYER_TYPES = {"linear_attention": "mamba", "full_attention": "attention", "mlp": "mlp"}
MIXER_TENSORS = {
    "in_proj": "in_proj", "conv1d": "conv", "conv1d.bias": "conv_bias", "dt_bias": "dt_bias",
    "A_log": "A_log", "D": "D", "norm": "mamba_norm", "out_proj": "out",
    "q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo",
    "up_proj": "w_up", "down_proj": "w_down"}
GLOBAL_TENSORS = {"model.embeddings": "embed", "model.norm_f": "final_norm",
                  "lm_head": "lm_head"}


def _get(hf: dict, *names, default=None):
    """The first of several spellings of a field that the config has."""
    return next((hf[n] for n in names if hf.get(n) is not None), default)


def layer_types(hf: dict[str, Any], path: pathlib.Path) -> tuple[str, ...]:
    listed = _get(hf, "layers_block_type", "layer_types")
    pattern = hf.get("hybrid_override_pattern")
    if listed is None and pattern is None:
        raise ArtifactError(path, "no layers_block_type or hybrid_override_pattern")
    try:
        return (tuple(HF_LAYER_TYPES[t] for t in listed) if listed is not None
                else tuple(PATTERN_TYPES[c] for c in pattern))
    except KeyError as exc:
        raise ArtifactError(path, f"layer type {exc.args[0]!r} is not supported (Mamba-2, "
                                  "attention and MLP layers are; MoE is not)") from None


def nemotron_model_config(hf: dict[str, Any], path: pathlib.Path) -> ModelConfig:
    _refuse_unsupported(hf, path)
    types = layer_types(hf, path)
    try:
        heads, hidden = int(hf["num_attention_heads"]), int(hf["hidden_size"])
        dt_min, dt_max = _get(hf, "time_step_limit", "mamba_dt_limit", default=(0.0, math.inf))
        return ModelConfig(
            architecture="nemotron_h", vocab_size=int(hf["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]), num_layers=len(types),
            num_heads=heads, num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(_get(hf, "head_dim", "attention_head_dim", default=hidden // heads)),
            rms_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 8192)),
            layer_types=types, mamba_num_heads=int(hf["mamba_num_heads"]),
            mamba_head_dim=int(hf["mamba_head_dim"]),
            mamba_state_size=int(hf["ssm_state_size"]),
            mamba_num_groups=int(_get(hf, "n_groups", "mamba_n_groups", default=8)),
            mamba_conv_kernel=int(_get(hf, "conv_kernel", "mamba_d_conv", default=4)),
            mamba_dt_min=float(dt_min),
            mamba_dt_max=0.0 if math.isinf(float(dt_max)) else float(dt_max))
    except (KeyError, ValueError, TypeError) as exc:
        raise ArtifactError(path, f"incomplete or invalid config ({exc})") from None


def _refuse_unsupported(hf: dict, path: pathlib.Path) -> None:
    if _get(hf, "mlp_hidden_act", default="relu2") != "relu2":
        raise ArtifactError(path, f"mlp_hidden_act {hf['mlp_hidden_act']!r} is not supported "
                                  "(relu2 is)")
    if _get(hf, "mamba_hidden_act", default="silu") != "silu":
        raise ArtifactError(path, "mamba_hidden_act other than silu is not supported")
    for flag in ("use_bias", "mlp_bias", "mamba_proj_bias"):
        if hf.get(flag):
            raise ArtifactError(path, f"{flag} is not supported")
    if not _get(hf, "use_conv_bias", "mamba_conv_bias", default=True):
        raise ArtifactError(path, "a Mamba conv without bias is not supported")
    if int(hf.get("num_nextn_predict_layers") or 0):
        raise ArtifactError(path, "MTP layers (num_nextn_predict_layers) are not supported")


def nemotron_params(sources: list, config: ModelConfig, dtype: str,
                    progress: common.ProgressFn | None) -> dict:
    """The params tree (model/config.py) of a NemotronHForCausalLM checkpoint."""
    def layout(name, array):
        if name.endswith(".conv"):
            return array.reshape(array.shape[0], -1).T  # [conv_dim, 1, K] -> [K, conv_dim]
        return array.T if array.ndim == 2 and name != "embed" else array

    return common.collect_params(sources, config, dtype, progress,
                                 lambda file, hf_name: params_name(file.path, hf_name, config),
                                 layout)


def params_name(path: pathlib.Path, hf_name: str, config: ModelConfig) -> str | None:
    """Our name of a checkpoint tensor, or None for one the model does not use."""
    if hf_name.startswith("backbone."):
        hf_name = "model." + hf_name.removeprefix("backbone.")
    base = hf_name.removesuffix(".weight")
    if base in GLOBAL_TENSORS:
        if base == "lm_head" and config.tie_word_embeddings:
            return None
        return GLOBAL_TENSORS[base]
    parts = base.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"]:
        index, leaf = int(parts[2]), parts[3]
        if leaf == "norm":
            return f"layers.{index}.norm"
        if leaf.startswith("mixer.") and leaf.removeprefix("mixer.") in MIXER_TENSORS:
            return f"layers.{index}.{MIXER_TENSORS[leaf.removeprefix('mixer.')]}"
    raise ArtifactError(path, f"unsupported tensor {hf_name!r}")
