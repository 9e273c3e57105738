"""Hugging Face Qwen3-VL / Qwen3.5 vision towers -> our `vision` component (model/vision/config.py).

Config: config.json's `vision_config` (transformers' Qwen3VLVisionConfig / Qwen3_5VisionConfig)
plus the wrapper's placeholder token ids. Tensors, under `model.visual.` (transformers v5) or
`visual.` (older saves):
    patch_embed.proj.weight [Hv, C, Tp, P, P] -> patch_embed [C*Tp*P*P, Hv]; .bias -> patch_bias
    pos_embed.weight                          -> pos_embed
    blocks.N.norm1 / norm2 (.weight, .bias)   -> blocks.N.attn_norm attn_norm_bias,
                                                 mlp_norm mlp_norm_bias
    blocks.N.attn.qkv, attn.proj              -> blocks.N.wqkv bqkv, wo bo
    blocks.N.mlp.linear_fc1, mlp.linear_fc2   -> blocks.N.w_fc1 b_fc1, w_fc2 b_fc2
    merger.{norm, linear_fc1, linear_fc2}     -> merger.norm norm_bias, w_fc1 b_fc1, w_fc2 b_fc2
    deepstack_merger_list.J.*                 -> deepstack.J.* (as merger)
Matrices are transposed from torch's [out, in] to our [in, out]. Our names come back prefixed
`vision.` (artifact/components.py).
"""
from __future__ import annotations

import pathlib
import re
from typing import Any

import numpy as np

from ninfer_jax.errors import ArtifactError
from ninfer_jax.model.vision.config import VisionConfig

PREFIXES = ("model.visual.", "visual.")
_MODULES = {"norm1": "attn_norm", "norm2": "mlp_norm", "attn.qkv": "qkv", "attn.proj": "o",
            "mlp.linear_fc1": "fc1", "mlp.linear_fc2": "fc2", "norm": "norm",
            "linear_fc1": "fc1", "linear_fc2": "fc2"}
_OURS = {  # (module kind, weight|bias) -> our leaf
    ("attn_norm", "weight"): "attn_norm", ("attn_norm", "bias"): "attn_norm_bias",
    ("mlp_norm", "weight"): "mlp_norm", ("mlp_norm", "bias"): "mlp_norm_bias",
    ("norm", "weight"): "norm", ("norm", "bias"): "norm_bias",
    ("qkv", "weight"): "wqkv", ("qkv", "bias"): "bqkv", ("o", "weight"): "wo", ("o", "bias"): "bo",
    ("fc1", "weight"): "w_fc1", ("fc1", "bias"): "b_fc1",
    ("fc2", "weight"): "w_fc2", ("fc2", "bias"): "b_fc2"}
_CONTAINER = re.compile(r"^(blocks|merger|deepstack_merger_list)(?:\.(\d+))?\.(.+)\.(weight|bias)$")


def vision_config(hf: dict[str, Any], path: pathlib.Path, text_hidden: int) -> VisionConfig | None:
    """Our vision config of a multimodal checkpoint's config.json, or None without a tower."""
    vision = hf.get("vision_config")
    if not vision:
        return None
    try:
        config = VisionConfig(
            depth=int(vision["depth"]), hidden_size=int(vision["hidden_size"]),
            intermediate_size=int(vision["intermediate_size"]),
            num_heads=int(vision["num_heads"]),
            out_hidden_size=int(vision.get("out_hidden_size", text_hidden)),
            num_position_embeddings=int(vision["num_position_embeddings"]),
            patch_size=int(vision.get("patch_size", 16)),
            temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
            spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
            in_channels=int(vision.get("in_channels", 3)),
            deepstack_layers=tuple(vision.get("deepstack_visual_indexes") or ()),
            rope_theta=float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            hidden_act=vision.get("hidden_act", "gelu_pytorch_tanh"),
            image_token_id=int(hf["image_token_id"]), video_token_id=int(hf["video_token_id"]),
            vision_start_token_id=int(hf["vision_start_token_id"]),
            vision_end_token_id=int(hf["vision_end_token_id"]))
    except (KeyError, ValueError, TypeError) as exc:
        raise ArtifactError(path, f"incomplete or invalid vision_config ({exc})") from None
    if config.out_hidden_size != text_hidden:
        raise ArtifactError(path, f"vision out_hidden_size {config.out_hidden_size} differs "
                                  f"from the text hidden size {text_hidden}")
    return config


def is_vision_tensor(hf_name: str) -> bool:
    return hf_name.startswith(PREFIXES)


def vision_name(path: pathlib.Path, hf_name: str) -> str:
    """Our dotted name (without the `vision.` prefix) of one tower tensor."""
    name = next(hf_name[len(p):] for p in PREFIXES if hf_name.startswith(p))
    fixed = {"patch_embed.proj.weight": "patch_embed", "patch_embed.proj.bias": "patch_bias",
             "pos_embed.weight": "pos_embed"}
    if name in fixed:
        return fixed[name]
    match = _CONTAINER.match(name)
    kind = match and _MODULES.get(match.group(3))
    leaf = kind and _OURS.get((kind, match.group(4)))
    if not leaf:
        raise ArtifactError(path, f"unsupported vision tensor {hf_name!r}")
    container = {"blocks": "blocks", "merger": "merger",
                 "deepstack_merger_list": "deepstack"}[match.group(1)]
    index = f".{int(match.group(2))}" if match.group(2) is not None else ""
    return f"{container}{index}.{leaf}"


def vision_array(name: str, array: np.ndarray) -> np.ndarray:
    """A torch tensor in our layout: the conv kernel flattened and transposed, matrices
    transposed, vectors as they are."""
    array = np.asarray(array, dtype=np.float32)
    if name == "patch_embed":
        return np.ascontiguousarray(array.reshape(array.shape[0], -1).T)
    if array.ndim == 2 and name != "pos_embed":
        return np.ascontiguousarray(array.T)
    return array
