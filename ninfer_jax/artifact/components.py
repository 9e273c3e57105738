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

`dflash` and `dflash2`, the block-diffusion drafters (model/dflash.py), are stored in
`dflash/` and `dflash2/` and loaded as params["dflash"] / params["dflash2"] when asked
(format.load_artifact(..., dflash="dflash"), `--spec dflash`). Their hyper-parameters are
metadata.json's `dflash_config` / `dflash2_config` (dflash.DFlashConfig), their tree is
DFlashConfig.expected_shapes, their names are prefixed `dflash.` / `dflash2.` (weight group
of that name; norms in `norms`).

`draft_head`, the reduced proposal head of --lm-head-draft, is stored in `draft_head/` and
loaded as params["draft_head"] when asked: weight [H, Vd] (a float, group `draft_head`) and
token_ids int32 [Vd], the vocabulary subset whose logits it gives (metadata.json
`draft_head_config`: {"vocab": Vd}).

`vision`, the image/video tower (model/vision/config.py), is stored in `vision/` and loaded as
`params["vision"]` only when asked (format.load_artifact(..., vision=True), `--vision`). Its
hyper-parameters are metadata.json's `vision_config`; its names are prefixed `vision.`
(`vision.blocks.0.wqkv`), so their weight group is `vision` (norm weights: `norms`).
"""
from __future__ import annotations

import dataclasses

from typing import Any

from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.dflash_config import DFlashConfig
from ninfer_jax.model.vision.config import VisionConfig

DFLASH_VARIANTS = ("dflash", "dflash2")  # component = directory = params key = name prefix
DRAFT_HEAD = "draft_head"
DRAFTER_COMPONENTS = (*DFLASH_VARIANTS, DRAFT_HEAD)
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
    text = {key: value for key, value in params.items()
            if key not in ("mtp", "vision", *DRAFTER_COMPONENTS)}
    return text, params.get("mtp")


def dflash_config_of(metadata: dict[str, Any], variant: str) -> DFlashConfig | None:
    """The artifact's `variant` drafter config (metadata.json `<variant>_config`), or None."""
    data = metadata.get(f"{variant}_config")
    return DFlashConfig.from_dict(data) if data else None


def dflash_expected_shapes(config: DFlashConfig | None) -> dict[str, tuple[int, ...]]:
    """`<variant>.`-prefixed name -> shape of every drafter tensor (empty without one)."""
    return config.expected_shapes(config.variant + ".") if config else {}


def draft_head_expected_shapes(metadata: dict[str, Any], hidden_size: int
                               ) -> dict[str, tuple[int, ...]]:
    """The draft_head component's tensors (empty without one)."""
    head = metadata.get("draft_head_config")
    if not head:
        return {}
    return {"draft_head.weight": (hidden_size, head["vocab"]),
            "draft_head.token_ids": (head["vocab"],)}


def vocabulary_subset_head(lm_head, token_ids) -> dict:
    """A draft_head tree from the target's output projection [H, V] (tied: embed.T) and the
    token ids it keeps, in the target's dtype."""
    import numpy as np

    token_ids = np.asarray(sorted(set(int(t) for t in token_ids)), np.int32)
    return {"weight": np.ascontiguousarray(np.asarray(lm_head)[:, token_ids]),
            "token_ids": token_ids}


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
