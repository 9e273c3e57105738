"""The optional parts of an artifact that live beside the text model's `weights/`.

`mtp`, the multi-token-prediction head of the hybrid Qwen families, is
stored as its own orbax checkpoint in `mtp/`, so a process that does not draft never reads
it, and is loaded as `params["mtp"]` (format.load_artifact(..., mtp=True)). Its tree is the
one model/config.py documents:

    fc [2H, H]  pre_fc_norm_embedding [H]  pre_fc_norm_hidden [H]  norm [H]
    layers: mtp_num_layers dicts shaped like a "full_attention" layer of the text model,
            with the model's MLP kind (experts on MoE models, never mlp_only_layers)

Names used here are dotted and prefixed `mtp.` (`mtp.layers.0.wq`), so their weight group
(format.tensor_group) is `mtp` and their norms are in `norms`.

`vision`, the image/video tower (model/vision/config.py), is stored in `vision/` and loaded as
`params["vision"]` only when asked (format.load_artifact(..., vision=True), `--vision`). Its
hyper-parameters are metadata.json's `vision_config`; its names are prefixed `vision.`
(`vision.blocks.0.wqkv`), so their weight group is `vision` (norm weights: `norms`).
"""
from __future__ import annotations

import dataclasses

from typing import Any

from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.vision.config import VisionConfig

MTP_DIR = "mtp"
MTP_PREFIX = "mtp."
VISION_DIR = "vision"
VISION_PREFIX = "vision."


def mtp_layer_config(config: ModelConfig) -> ModelConfig:
    """A config whose layers are the MTP head's layers: gated full attention, and the text
    model's MoE (or dense) MLP in every one of them."""
    count = config.mtp_num_layers
    return dataclasses.replace(config, num_layers=count, layer_types=("full_attention",) * count,
                               mlp_only_layers=())


def mtp_expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """`mtp.`-prefixed name -> shape of every tensor of the MTP head (empty without one)."""
    if not config.mtp_num_layers:
        return {}
    H = config.hidden_size
    shapes = {"mtp.fc": (2 * H, H), "mtp.pre_fc_norm_embedding": (H,),
              "mtp.pre_fc_norm_hidden": (H,), "mtp.norm": (H,)}
    layers = mtp_layer_config(config).expected_shapes()
    shapes.update({MTP_PREFIX + name: shape for name, shape in layers.items()
                   if name.startswith("layers.")})
    return shapes


def split_mtp(params: dict) -> tuple[dict, dict | None]:
    """(text params, mtp tree or None): what goes to weights/ and what goes to mtp/."""
    text = {key: value for key, value in params.items() if key not in ("mtp", "vision")}
    return text, params.get("mtp")


def vision_expected_shapes(vision: VisionConfig | None) -> dict[str, tuple[int, ...]]:
    """`vision.`-prefixed name -> shape of every tensor of the tower (empty without one)."""
    return vision.expected_shapes(VISION_PREFIX) if vision else {}


def vision_config_of(metadata: dict[str, Any]) -> VisionConfig | None:
    """The artifact's vision config (metadata.json `vision_config`), or None."""
    data = metadata.get("vision_config")
    return VisionConfig.from_dict(data) if data else None


def add_vision_tensor(tree: dict, name: str, array: Any) -> None:
    """Place one tower tensor under its dotted name (without `vision.`): `blocks.3.wqkv` and
    `deepstack.1.norm` index lists, `merger.w_fc1` a dict."""
    parts = name.split(".")
    node: Any = tree
    for part, following in zip(parts[:-1], parts[1:]):
        if isinstance(node, list):
            node.extend({} for _ in range(int(part) + 1 - len(node)))
            node = node[int(part)]
        else:
            node = node.setdefault(part, [] if following.isdigit() else {})
    node[parts[-1]] = array
