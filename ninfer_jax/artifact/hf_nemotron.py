"""Nemotron-H checkpoints (`NemotronHForCausalLM`) -> our config and params tree, as
transformers' configuration_nemotron_h / modeling_nemotron_h read them.

Config: the layer pattern comes from `layers_block_type` (transformers' names) or the
published `hybrid_override_pattern` ("M" Mamba-2, "*" attention, "-" MLP, "E" MoE); the
attention head dim from `head_dim` or the published `attention_head_dim`; the Mamba-2 fields
from their transformers names or the published `mamba_*` aliases (n_groups / mamba_n_groups,
conv_kernel / mamba_d_conv, time_step_limit / mamba_dt_limit). MoE layers (Nemotron 3): n_routed_experts of
moe_intermediate_size, num_experts_per_tok, one shared expert of
moe_shared_expert_intermediate_size (transformers builds one MLP of that width whatever
n_shared_experts says), n_group / topk_group / routed_scaling_factor / norm_topk_prob for the
router. Refused: an MLP activation other than relu2, biases on the Mamba projections or the
MLP, a conv without bias, attention biases (transformers builds its attention without them),
MTP layers, MoE latent projections (moe_latent_size).
Tensors: `backbone.` (published checkpoints) or `model.` prefixes; conv1d.weight
[conv_dim, 1, K] is stored as conv [K, conv_dim]; projections are transposed. MoE: mixer.gate
[E, H] -> router, mixer.gate.e_score_correction_bias -> router_bias, mixer.shared_experts.
{up,down}_proj -> shared_w_up / shared_w_down, and the experts either one per expert
(mixer.experts.J.{up,down}_proj, as published and as save_pretrained writes them), stacked
once a layer's 2E are read, or packed (mixer.experts.up_proj [E, I, H], down_proj [E, H, I],
transformers' in-memory layout) -> experts_up [E, H, I], experts_down [E, I, H].
"""
from __future__ import annotations

import math
import pathlib
import re
from typing import Any

import numpy as np

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.errors import ArtifactError
from ninfer_jax.model.config import ModelConfig

NEMOTRON_ARCHITECTURES = {"NemotronHForCausalLM": "nemotron_h"}
PATTERN_TYPES = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
HF_LAYER_TYPES = {"linear_attention": "mamba", "full_attention": "attention", "mlp": "mlp",
                  "moe": "moe"}
MIXER_TENSORS = {
    "in_proj": "in_proj", "conv1d": "conv", "conv1d.bias": "conv_bias", "dt_bias": "dt_bias",
    "A_log": "A_log", "D": "D", "norm": "mamba_norm", "out_proj": "out",
    "q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo",
    "up_proj": "w_up", "down_proj": "w_down",
    "gate": "router", "gate.e_score_correction_bias": "router_bias",
    "shared_experts.up_proj": "shared_w_up", "shared_experts.down_proj": "shared_w_down",
    "experts.up_proj": "experts_up", "experts.down_proj": "experts_down"}
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mixer\.experts\.(\d+)\.(up|down)_proj$")
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
                                  "attention, MLP and MoE layers are)") from None


def nemotron_model_config(hf: dict[str, Any], path: pathlib.Path) -> ModelConfig:
    _refuse_unsupported(hf, path)
    types = layer_types(hf, path)
    try:
        heads, hidden = int(hf["num_attention_heads"]), int(hf["hidden_size"])
        dt_min, dt_max = (_number(v) for v in _get(hf, "time_step_limit", "mamba_dt_limit",
                                                   default=(0.0, math.inf)))
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
            mamba_dt_max=0.0 if math.isinf(float(dt_max)) else float(dt_max),
            **(_moe_fields(hf) if "moe" in types else {}))
    except (KeyError, ValueError, TypeError) as exc:
        raise ArtifactError(path, f"incomplete or invalid config ({exc})") from None


def _number(value) -> float:
    """A float of config.json, also as transformers 5 writes a non-finite one
    ({"__float__": "Infinity"})."""
    return float(value["__float__"] if isinstance(value, dict) else value)


def _moe_fields(hf: dict) -> dict:
    return dict(num_experts=int(hf["n_routed_experts"]),
                num_experts_per_tok=int(hf["num_experts_per_tok"]),
                moe_intermediate_size=int(hf["moe_intermediate_size"]),
                shared_expert_intermediate_size=int(
                    hf.get("moe_shared_expert_intermediate_size") or 0)
                if int(hf.get("n_shared_experts", 1)) else 0,
                norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
                num_expert_groups=int(hf.get("n_group") or 1),
                num_topk_groups=int(hf.get("topk_group") or 1),
                routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)))


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
    if hf.get("moe_latent_size") is not None:
        raise ArtifactError(path, "MoE latent projections (moe_latent_size) are not supported")
    if int(hf.get("num_nextn_predict_layers") or 0):
        raise ArtifactError(path, "MTP layers (num_nextn_predict_layers) are not supported")


def nemotron_params(sources: list, config: ModelConfig, dtype: str,
                    progress: common.ProgressFn | None) -> dict:
    """The params tree (model/config.py) of a NemotronHForCausalLM checkpoint."""
    params: dict = {}
    experts: dict[int, dict[tuple[str, int], np.ndarray]] = {}  # a layer's per-expert parts
    for index, (file, hf_name) in enumerate(sources, start=1):
        if progress:
            progress(index, len(sources), hf_name)
        array = lambda: np.asarray(file.get(hf_name), dtype=np.float32)  # noqa: E731
        expert = _EXPERT.match(_canonical(hf_name).removesuffix(".weight"))
        if expert:
            layer, j, part = int(expert.group(1)), int(expert.group(2)), expert.group(3)
            if j >= config.num_experts:
                raise ArtifactError(file.path, f"{hf_name}: expert {j} is beyond "
                                               f"num_experts={config.num_experts}")
            parts = experts.setdefault(layer, {})
            parts[part, j] = array()
            if len(parts) == 2 * config.num_experts:  # the layer is complete: stack it
                for leaf, part in (("experts_up", "up"), ("experts_down", "down")):
                    stacked = np.stack([parts.pop((part, e)).T
                                        for e in range(config.num_experts)])
                    name = f"layers.{layer}.{leaf}"
                    common.add_to_params(params, name, common.store(name, stacked, dtype),
                                         config.num_layers)
                del experts[layer]
            continue
        name = params_name(file.path, hf_name, config)
        if name is not None:
            common.add_to_params(params, name, common.store(name, _layout(name, array()), dtype),
                                 config.num_layers)
    if experts:
        layer, parts = next(iter(experts.items()))
        raise ArtifactError(sources[0][0].path, f"layer {layer}'s experts are incomplete "
                                                f"({len(parts)} of {2 * config.num_experts})")
    return params


def _layout(name: str, array: np.ndarray) -> np.ndarray:
    """The float32 array in model/config.py's layout."""
    if name.endswith(".conv"):
        return array.reshape(array.shape[0], -1).T  # [conv_dim, 1, K] -> [K, conv_dim]
    if name.endswith((".experts_up", ".experts_down")):  # packed [E, out, in] -> [E, in, out]
        return np.swapaxes(array, 1, 2)
    return array.T if array.ndim == 2 and name != "embed" else array


def _canonical(hf_name: str) -> str:
    return ("model." + hf_name.removeprefix("backbone.") if hf_name.startswith("backbone.")
            else hf_name)


def params_name(path: pathlib.Path, hf_name: str, config: ModelConfig) -> str | None:
    """Our name of a checkpoint tensor, or None for one the model does not use."""
    hf_name = _canonical(hf_name)
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
