"""Which `weight_formats` group a params name belongs to, and the dtype that implies.

Groups: `embed`, `lm_head`, `layers` (every other layer tensor), `mtp` (the MTP head's
tensors, named `mtp.*`) and `norms`: every RMSNorm weight (names ending in `norm`, and the MTP
head's `pre_fc_norm_*`) plus the Gated DeltaNet / Mamba-2 per-head `dt_bias` and `A_log` (and
Mamba-2's skip `D`), the GLM router's `router_bias` and Gemma's per-layer `layer_scalar`, always f32.
"""
from __future__ import annotations

FLOAT_FORMATS = {"f32": "float32", "bf16": "bfloat16"}
# Vectors kept in f32 with the norms: the Gated DeltaNet decay is exp(-exp(A_log)), and the
# router bias is added to scores in [0, 1] whose small differences pick the experts; Gemma's
# layer_scalar (one value per layer) scales the whole residual.
F32_VECTORS = ("dt_bias", "A_log", "D", "router_bias", "layer_scalar")
MTP_NORMS = ("pre_fc_norm_embedding", "pre_fc_norm_hidden")  # norms not named *norm


def tensor_group(name: str) -> str:
    """The weight_formats group of a params name: embed, lm_head, layers, mtp or norms."""
    if is_norm(name) or name.rsplit(".", 1)[-1] in F32_VECTORS:
        return "norms"
    return name.split(".", 1)[0]


def is_norm(name: str) -> bool:
    """Whether a params name is an RMSNorm weight (`layers.0.attn_norm`, `mtp.pre_fc_norm_hidden`)."""
    return name.endswith("norm") or name.rsplit(".", 1)[-1] in MTP_NORMS


def expected_dtype(name: str, weight_formats: dict[str, str]) -> str | None:
    """numpy dtype name a plain array must have, or None for a quantized group."""
    if name.endswith("token_ids"):  # the draft head's vocabulary subset (components.py)
        return "int32"
    group_format = weight_formats.get(tensor_group(name), "f32")
    return FLOAT_FORMATS.get(group_format)
