"""Fused projections: q|k|v, gate|up and the other products of one input joined at load time.

Projections that read the same input become one matrix, so a step runs one product for them
and a decode GEMV streams one larger weight (H200, Qwen3-8B shape: the separate q, k and v
products ran far below the bandwidth of the MLP's). `fuse_projections(params, config)` turns
each layer of a `llama`/`qwen3` params tree (model/config.py) into

    wqkv       [H, (NH + 2*NK) * D]   wq | wk | wv     (joined along the output axis)
    w_gate_up  [H, 2F]                w_gate | w_up

and model/llama.py and layers.swiglu_mlp split the product again. The hybrid families
(`qwen3_5`, `qwen3_5_moe`, `qwen3_next`; one device only, `groups` == 1) join more, since
their narrow layers (hidden 2048 in the 35B-A3B) are many small products whose launches cost
as much as their bytes in a decode step:

    wqkv               [H, NH*D*(1|2) + 2*NK*D]   wq | wk | wv          (gated attention)
    in_qkvzba          [H, conv_dim + 2*Hv + Hv*dv]  in_qkv | in_z | in_b | in_a  (DeltaNet)
    w_gate_up          [H, 2F]                    w_gate | w_up         (dense MLP layers)
    shared_w_gate_up   [H, 2Is]                   shared_w_gate | shared_w_up
    router_shared_gate [H, E + 1]                 router | shared_gate  (f32 logits)

model/hybrid.py, gated_deltanet.py and moe_mlp.py split them again. With the shared-expert
fold on (FOLD_SHARED_EXPERT, or NINFER_FOLD_SHARED_EXPERT=1 at load), a MoE layer whose shared
expert is as wide as its routed ones also gets it as expert E of the routed tensors:

    experts_gate_up    [E + 1, H, 2I]             experts_gate_up | shared_w_gate_up
    experts_down       [E + 1, I, H]              experts_down | shared_w_down

and moe_mlp routes every token to it with its sigmoid gate as the weight, so the routed
kernels compute it beside the k chosen experts (two GEMVs and a gating fusion fewer per MoE
layer in a decode step; the 35B-A3B's batch-1 step is 4.6 ms of small kernels, run 37). Under tensor parallelism
(`groups` = the mesh size) the columns are ordered per shard instead, so a column split gives
each device whole heads and its own slice of F (model/tensor_parallel.py); quantized leaves
then stay unfused. Plain float weights always
fuse. Quantized leaves (kernels/quant_matmul/formats.py) fuse when all parts share a format
whose every array runs along the output axis last: int8 and fp8 (codes [K, N], per-channel
scales [N]) and int4 (codes pack column pairs within one leaf, so [Kp, N/2] joins cleanly;
group scales [Kp/128, N]). nvfp4 leaves carry one global scale each and stay separate, as do
parts of mixed formats or row counts. GGUF block leaves (q8_0, q4_0, q4_1) hold one row of
blocks per output column, so theirs join along the first axis. Already fused layers, and
hybrid families under tensor parallelism, are returned unchanged.
Memory: host (numpy) leaves are joined on the host, before steps.cast_params places the tree
on the device, so the device never holds both layouts; device leaves are joined on their
device, and the parts stay there as long as the caller keeps them.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.kernels.quant_matmul.formats import BLOCK_FORMATS, format_of, logical_shape
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.tensor_parallel import group_columns

DENSE_ARCHITECTURES = ("llama", "qwen3")
HYBRID_ARCHITECTURES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
# fused leaf -> the leaves it replaces, in column order
FUSED_LEAVES = {"wqkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up")}
HYBRID_FUSED_LEAVES = {**FUSED_LEAVES, "in_qkvzba": ("in_qkv", "in_z", "in_b", "in_a"),
                       "shared_w_gate_up": ("shared_w_gate", "shared_w_up"),
                       "router_shared_gate": ("router", "shared_gate")}
# quantized formats whose arrays all join along their last (output) axis
JOINABLE_FORMATS = ("int8", "fp8", "int4")
# On: run 52e (H100, the 35B-A3B through JaxRunner, same call) 251.5 / 911.5 tok/s at 1 / 8
# rows folded against 240.8 / 867.8 unfolded.
FOLD_SHARED_EXPERT = True
FOLD_ENV = "NINFER_FOLD_SHARED_EXPERT"  # "1" / "0" overrides FOLD_SHARED_EXPERT at load


def fold_shared_expert_on() -> bool:
    override = os.environ.get(FOLD_ENV, "")
    if override not in ("", "0", "1"):
        raise ValueError(f"{FOLD_ENV}={override!r}: expected 1 or 0")
    return override == "1" if override else FOLD_SHARED_EXPERT


def fused_leaves(config: ModelConfig, groups: int = 1) -> dict | None:
    """The groups of leaves a layer of this family joins (fused leaf -> its parts), or None:
    dense families always, hybrids on one device only (under tensor parallelism their GDN
    channels are grouped per shard instead)."""
    if config.architecture in HYBRID_ARCHITECTURES and groups == 1:
        return HYBRID_FUSED_LEAVES
    return FUSED_LEAVES if config.architecture in DENSE_ARCHITECTURES else None


def fuse_projections(params: dict, config: ModelConfig, groups: int = 1) -> dict:
    """`params` with each layer's fusable projection groups joined (module docstring);
    `groups` > 1 lays the columns out per tensor-parallel shard (model/tensor_parallel.py)."""
    leaves = fused_leaves(config, groups)
    if "layers" not in params or leaves is None:
        return params
    return {**params, "layers": [fuse_layer(layer, groups, leaves)
                                 for layer in params["layers"]]}


def fuse_layer(layer: dict, groups: int = 1, groups_of_leaves: dict = FUSED_LEAVES) -> dict:
    """One layer's leaves with every group of `groups_of_leaves` (fused leaf -> its parts)
    that can be joined replaced."""
    layer = dict(layer)
    for fused, parts in groups_of_leaves.items():
        if not all(part in layer for part in parts):
            continue
        joined = join_columns([layer[part] for part in parts], groups)
        if joined is not None:
            for part in parts:
                del layer[part]
            layer[fused] = joined
    if groups == 1 and "shared_w_gate_up" in groups_of_leaves and fold_shared_expert_on():
        layer = fold_shared_expert(layer)
    return layer


def fold_shared_expert(layer: dict) -> dict:
    """`layer` with its gated shared expert appended to the routed experts as expert E (see
    the module docstring), or unchanged when it has none, it is quantized or its width
    differs from the routed experts'."""
    names = ("experts_gate_up", "experts_down", "shared_w_gate_up", "shared_w_down")
    if not all(name in layer and not isinstance(layer[name], dict) for name in names):
        return layer
    if "router_shared_gate" not in layer and "shared_gate" not in layer:
        return layer  # an ungated shared expert is not this fold's
    gate_up, down, shared_gate_up, shared_down = (layer[name] for name in names)
    if (tuple(shared_gate_up.shape) != tuple(gate_up.shape[1:])
            or tuple(shared_down.shape) != tuple(down.shape[1:])):
        return layer
    layer = {name: leaf for name, leaf in layer.items() if name not in names[2:]}
    layer["experts_gate_up"] = _concatenate([gate_up, shared_gate_up[None]], axis=0)
    layer["experts_down"] = _concatenate([down, shared_down[None]], axis=0)
    return layer


def join_columns(leaves: list, groups: int = 1):
    """One weight leaf whose output columns are those of `leaves` in order, or None when their
    formats do not allow it (see the module docstring). With `groups` > 1 (plain weights
    only) each part is split in that many column blocks and the blocks are ordered by group:
    [A_0 B_0 | A_1 B_1 | ...] (tensor_parallel.group_columns)."""
    formats = {format_of(leaf) for leaf in leaves}
    rows = {logical_shape(leaf)[0] for leaf in leaves}
    if len(formats) != 1 or len(rows) != 1:
        return None
    fmt = formats.pop()
    if fmt == "bf16" and groups > 1:
        if any(logical_shape(leaf)[1] % groups for leaf in leaves):
            return None
        return group_columns(_concatenate(leaves),
                             tuple(logical_shape(leaf)[1] for leaf in leaves), groups)
    if groups > 1:
        return None
    if fmt == "bf16":  # any plain float array
        return _concatenate(leaves)
    if fmt in BLOCK_FORMATS:
        return {fmt: _concatenate([leaf[fmt] for leaf in leaves], axis=0)}
    if fmt not in JOINABLE_FORMATS:
        return None
    return {key: _concatenate([leaf[key] for leaf in leaves]) for key in leaves[0]}


def _concatenate(arrays: list, axis: int = -1):
    """Join along `axis`: on the host for numpy arrays, on the device for jax ones."""
    if any(isinstance(array, jax.Array) for array in arrays):
        return jnp.concatenate(arrays, axis=axis)
    dtype = np.result_type(*arrays)
    return np.concatenate([np.asarray(array, dtype) for array in arrays], axis=axis)
