"""Hugging Face tensors of the hybrid Qwen families and of GLM MoE -> our params tree
(model/config.py); the two share the MoE tensors' layout and the per-expert stacking.

Names, as transformers' modeling_qwen3_5 / _qwen3_5_moe / _qwen3_next define the modules
(multimodal checkpoints put the language model under `model.language_model.`; its vision
tower `model.visual.*` is converted by hf_vision.py into the vision component):
    model.layers.N.input_layernorm / post_attention_layernorm        attn_norm / mlp_norm
    ...self_attn.{q,k,v,o}_proj, q_norm, k_norm                       wq wk wv wo q_norm k_norm
    ...linear_attn.in_proj_qkv / in_proj_z / in_proj_b / in_proj_a    in_qkv in_z in_b in_a
    ...linear_attn.in_proj_qkvz [Hk*(2dk + 2r*dv), H], in_proj_ba [Hk*2r, H]   (Qwen3-Next)
         grouped per key head g: rows [q_g | k_g | v_g (r value heads) | z_g] and [b_g | a_g],
         r = Hv / Hk; un-grouped here into in_qkv (all Q | all K | all V), in_z, in_b, in_a
    ...linear_attn.conv1d [conv_dim, 1, K] -> conv [K, conv_dim]; dt_bias, A_log; norm -> gdn_norm
    ...linear_attn.out_proj                                           out
    ...mlp.{gate,up,down}_proj                                        w_gate w_up w_down
    ...mlp.gate [E, H] -> router; mlp.shared_expert_gate [1, H] -> shared_gate
    ...mlp.shared_expert.{gate,up,down}_proj                          shared_w_gate/_up/_down
    ...mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]       (packed, transformers v5)
    ...mlp.experts.J.{gate,up,down}_proj                              (one per expert, on the hub)
         -> experts_gate_up [E, H, 2I] (gate columns first), experts_down [E, I, H]
    GLM MoE (transformers' modeling_glm4_moe) adds:
    ...self_attn.{q,k,v}_proj.bias                                    bq bk bv
    ...mlp.gate.e_score_correction_bias -> router_bias; mlp.shared_experts.{gate,up,down}_proj
         -> shared_w_gate/_up/_down; model.layers.L.. (L = num_layers): its next-token
         prediction layers, not converted
    mtp.fc [H, 2H] -> mtp.fc [2H, H]; mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.norm;
    mtp.layers.N.* named like a decoder layer                         mtp.layers.N.*
Matrices are transposed from torch's [out, in] to our [in, out].
"""
from __future__ import annotations

import pathlib
import re

import numpy as np

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.errors import ArtifactError
from ninfer_jax.model.config import ModelConfig

GLOBAL_TENSORS = {"model.embed_tokens": "embed", "model.norm": "final_norm", "lm_head": "lm_head",
                  "mtp.fc": "mtp.fc", "mtp.pre_fc_norm_embedding": "mtp.pre_fc_norm_embedding",
                  "mtp.pre_fc_norm_hidden": "mtp.pre_fc_norm_hidden", "mtp.norm": "mtp.norm"}
LAYER_TENSORS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm",
    "self_attn.q_proj": "wq", "self_attn.k_proj": "wk", "self_attn.v_proj": "wv",
    "self_attn.o_proj": "wo", "self_attn.q_norm": "q_norm", "self_attn.k_norm": "k_norm",
    "linear_attn.in_proj_qkv": "in_qkv", "linear_attn.in_proj_z": "in_z",
    "linear_attn.in_proj_b": "in_b", "linear_attn.in_proj_a": "in_a",
    "linear_attn.conv1d": "conv", "linear_attn.dt_bias": "dt_bias", "linear_attn.A_log": "A_log",
    "linear_attn.norm": "gdn_norm", "linear_attn.out_proj": "out",
    "mlp.gate_proj": "w_gate", "mlp.up_proj": "w_up", "mlp.down_proj": "w_down",
    "mlp.gate": "router", "mlp.shared_expert_gate": "shared_gate",
    "mlp.shared_expert.gate_proj": "shared_w_gate", "mlp.shared_expert.up_proj": "shared_w_up",
    "mlp.shared_expert.down_proj": "shared_w_down",
    "mlp.experts.gate_up_proj": "experts_gate_up", "mlp.experts.down_proj": "experts_down",
    "self_attn.q_proj.bias": "bq", "self_attn.k_proj.bias": "bk", "self_attn.v_proj.bias": "bv",
    "mlp.gate.e_score_correction_bias": "router_bias",
    "mlp.shared_experts.gate_proj": "shared_w_gate", "mlp.shared_experts.up_proj": "shared_w_up",
    "mlp.shared_experts.down_proj": "shared_w_down"}
_LAYER = re.compile(r"^(model\.layers|mtp\.layers)\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj$")
SKIPPED_PREFIXES = ("model.visual.",)  # the vision tower: hf_vision.py converts it


def canonical_name(hf_name: str) -> str:
    """Our reading of an HF name: `.weight` dropped, the multimodal prefix folded away."""
    base = hf_name.removesuffix(".weight")
    return "model." + base[len("model.language_model."):] \
        if base.startswith("model.language_model.") else base


def is_skipped(hf_name: str) -> bool:
    """Vision-tower tensors and RoPE tables (recomputed from rope_theta) are not converted."""
    base = canonical_name(hf_name)
    return base.startswith(SKIPPED_PREFIXES) or base.endswith("rotary_emb.inv_freq")


def mtp_layer_count(hf_names: list[str]) -> int:
    """How many MTP layers the checkpoint stores (mtp.layers.N.*)."""
    found = [int(m.group(2)) for m in map(_LAYER.match, map(canonical_name, hf_names))
             if m and m.group(1) == "mtp.layers"]
    return max(found) + 1 if found else 0


def hybrid_params(sources: list, config: ModelConfig, dtype: str,
                  progress: common.ProgressFn | None) -> dict:
    """Params (text model and `mtp`) from (SafetensorsFile, hf_name) pairs. One-per-expert
    tensors wait, in the storage dtype, until their layer has all 3E of them, then are stacked:
    a layer's experts, not the model's, are held twice."""
    params: dict = {}
    experts: dict[str, dict[tuple[str, int], np.ndarray]] = {}
    for index, (file, hf_name) in enumerate(sources, start=1):
        if progress:
            progress(index, len(sources), hf_name)
        if is_skipped(hf_name) or _is_glm_nextn(hf_name, config):
            continue
        array = np.asarray(file.get(hf_name), dtype=np.float32)
        expert = _expert_part(hf_name)
        if expert:
            prefix, key = expert
            if key[1] >= config.num_experts:
                raise ArtifactError(file.path, f"{hf_name}: expert {key[1]} is beyond "
                                               f"num_experts={config.num_experts}")
            parts = experts.setdefault(prefix, {})
            parts[key] = common.cast(array, dtype)
            converted = _stack_experts(prefix, experts.pop(prefix), config) \
                if len(parts) == 3 * config.num_experts else []
        else:
            converted = _convert(file.path, hf_name, array, config)
        for name, value in converted:
            if name == "lm_head" and config.tie_word_embeddings:
                continue
            common.add_to_params(params, name, common.store(name, value, dtype), config.num_layers)
    if experts:
        prefix, parts = next(iter(experts.items()))
        missing = sorted({f"{kind}:{j}" for kind in ("gate", "up", "down")
                          for j in range(config.num_experts)} - {f"{k}:{j}" for k, j in parts})
        raise ArtifactError(sources[0][0].path.parent,
                            f"{prefix}mlp.experts incomplete (missing {missing[:4]})")
    return params


def _is_glm_nextn(hf_name: str, config: ModelConfig) -> bool:
    """A GLM checkpoint's next-token-prediction layer, stored after the decoder layers."""
    match = _LAYER.match(canonical_name(hf_name))
    return (config.is_glm and match is not None and match.group(1) == "model.layers"
            and int(match.group(2)) >= config.num_layers)


def _expert_part(hf_name: str) -> tuple[str, tuple[str, int]] | None:
    """(our layer prefix, (gate|up|down, expert index)) of a one-per-expert tensor."""
    match = _LAYER.match(canonical_name(hf_name))
    expert = _EXPERT.match(match.group(3)) if match else None
    if expert is None:
        return None
    return _prefix(match), (expert.group(2), int(expert.group(1)))


def _prefix(match: re.Match) -> str:
    return f"{'mtp.' if match.group(1) == 'mtp.layers' else ''}layers.{int(match.group(2))}."


def _convert(path: pathlib.Path, hf_name: str, array: np.ndarray,
             config: ModelConfig) -> list[tuple[str, np.ndarray]]:
    base = canonical_name(hf_name)
    if base in GLOBAL_TENSORS:
        name = GLOBAL_TENSORS[base]
        return [(name, array if name == "embed" or array.ndim == 1 else array.T)]
    match = _LAYER.match(base)
    if match is None:
        raise ArtifactError(path, f"unsupported tensor {hf_name!r}")
    prefix, rest = _prefix(match), match.group(3)
    if rest == "linear_attn.in_proj_qkvz":
        qkv, z = ungroup_qkvz(array, config)
        return [(prefix + "in_qkv", qkv), (prefix + "in_z", z)]
    if rest == "linear_attn.in_proj_ba":
        b, a = ungroup_ba(array, config)
        return [(prefix + "in_b", b), (prefix + "in_a", a)]
    if rest not in LAYER_TENSORS:
        raise ArtifactError(path, f"unsupported tensor {hf_name!r}")
    return [(prefix + LAYER_TENSORS[rest], _layout(LAYER_TENSORS[rest], array))]


def _layout(leaf: str, array: np.ndarray) -> np.ndarray:
    if leaf == "conv":  # [conv_dim, 1, K] -> [K, conv_dim]
        return array[:, 0, :].T
    if leaf in ("experts_gate_up", "experts_down"):  # [E, out, in] -> [E, in, out]
        return array.transpose(0, 2, 1)
    return array.T if array.ndim == 2 else array


def ungroup_qkvz(weight: np.ndarray, config: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-Next in_proj_qkvz [Hk*(2dk + 2r*dv), H] -> (in_qkv [H, conv_dim], in_z [H, Hv*dv])."""
    Hk, dk, dv, r = _linear_dims(config)
    grouped = weight.reshape(Hk, 2 * dk + 2 * r * dv, weight.shape[-1])
    q, k = grouped[:, :dk], grouped[:, dk:2 * dk]
    v, z = grouped[:, 2 * dk:2 * dk + r * dv], grouped[:, 2 * dk + r * dv:]
    rows = lambda part: part.reshape(-1, weight.shape[-1])  # noqa: E731  heads in order
    return np.concatenate([rows(q), rows(k), rows(v)]).T, rows(z).T


def ungroup_ba(weight: np.ndarray, config: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-Next in_proj_ba [Hk*2r, H] -> (in_b [H, Hv], in_a [H, Hv])."""
    Hk, _, _, r = _linear_dims(config)
    grouped = weight.reshape(Hk, 2 * r, weight.shape[-1])
    return (grouped[:, :r].reshape(-1, weight.shape[-1]).T,
            grouped[:, r:].reshape(-1, weight.shape[-1]).T)


def _linear_dims(config: ModelConfig) -> tuple[int, int, int, int]:
    Hk = config.linear_num_key_heads
    return (Hk, config.linear_key_head_dim, config.linear_value_head_dim,
            config.linear_num_value_heads // Hk)


def _stack_experts(prefix: str, parts: dict[tuple[str, int], np.ndarray],
                   config: ModelConfig) -> list[tuple[str, np.ndarray]]:
    """All 3E per-expert gate/up/down [out, in] tensors of a layer -> experts_gate_up,
    experts_down."""
    E = config.num_experts
    gate_up = np.stack([np.concatenate([parts["gate", j].T, parts["up", j].T], axis=1)
                        for j in range(E)])
    down = np.stack([parts["down", j].T for j in range(E)])
    return [(prefix + "experts_gate_up", gate_up), (prefix + "experts_down", down)]
