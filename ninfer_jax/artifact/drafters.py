"""The drafter components of an artifact (components.py): the public DFlash / DFlash2
checkpoint layout imported, random drafters for init-random, the reduced proposal head, and
adding any of them to ArtifactContents.

Public layout (z-lab/dflash `DFlashDraftModel` / `DFlash2DraftModel`, a Hugging Face
directory: config.json and *.safetensors; torch Linear weights are [out, in]):
    config.json  Qwen3 fields (hidden_size, num_hidden_layers, num_attention_heads,
                 num_key_value_heads, head_dim, intermediate_size, rms_norm_eps, rope_theta or
                 rope_parameters.rope_theta, vocab_size, layer_types, sliding_window, is_causal)
                 and `dflash_config` {target_layer_ids, block_size, mask_token_id,
                 input_embedding_scale, output_multiplier, final_logit_softcapping,
                 conv_kernel_size, conv_group_size, selector_rank, selector_top_k} (each key
                 also read from the top level, as the reference does)
    fc.weight [H, n H] -> fc [n H, H];  hidden_norm.weight, norm.weight
    layers.N.input_layernorm / post_attention_layernorm -> attn_norm / mlp_norm
    layers.N.self_attn.{q,k,v,o}_proj, q_norm, k_norm -> wq wk wv wo q_norm k_norm
    layers.N.mlp.{gate,up,down}_proj -> w_gate w_up w_down
    DFlash2: layers.N.{attention,mlp}_conv.base_kernel [2, taps, H] -> {attn,mlp}_conv_base,
             ...kernel_projection.weight [2 taps G, H] -> {attn,mlp}_conv_proj [H, 2 taps G];
             candidate_selector.hidden_projection.weight [r, H] -> selector.hidden_projection,
             candidate_selector.{predecessor,successor}_codebook[.weight] [V, r]
The drafter shares the target's embedding and lm_head; a checkpoint's own copies of them
(embed_tokens / lm_head) are not imported.
"""
from __future__ import annotations

import json
import pathlib
import re

import numpy as np

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.artifact.components import DRAFT_HEAD, vocabulary_subset_head
from ninfer_jax.artifact.safetensors_io import SafetensorsFile
from ninfer_jax.errors import ArtifactError
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.dflash_config import DFlashConfig

ARCHITECTURES = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "mlp_norm",
    "self_attn.q_proj.weight": "wq", "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv", "self_attn.o_proj.weight": "wo",
    "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
    "mlp.gate_proj.weight": "w_gate", "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
    "attention_conv.base_kernel": "attn_conv_base",
    "attention_conv.kernel_projection.weight": "attn_conv_proj",
    "mlp_conv.base_kernel": "mlp_conv_base",
    "mlp_conv.kernel_projection.weight": "mlp_conv_proj"}
_TOP_NAMES = {
    "fc.weight": "fc", "hidden_norm.weight": "hidden_norm", "norm.weight": "norm",
    "candidate_selector.hidden_projection.weight": "selector.hidden_projection",
    "candidate_selector.predecessor_codebook": "selector.predecessor",
    "candidate_selector.predecessor_codebook.weight": "selector.predecessor",
    "candidate_selector.successor_codebook": "selector.successor",
    "candidate_selector.successor_codebook.weight": "selector.successor"}
_SHARED = ("embed_tokens.weight", "lm_head.weight")  # the target's, not imported
_TRANSPOSED = ("fc", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "attn_conv_proj",
               "mlp_conv_proj", "selector.hidden_projection")


def dflash_config_from_hf(hf: dict, where: pathlib.Path) -> DFlashConfig:
    """Our DFlashConfig of a public DFlash / DFlash2 config.json."""
    names = hf.get("architectures") or []
    variants = {ARCHITECTURES[n] for n in names if n in ARCHITECTURES}
    if len(variants) != 1:
        raise ArtifactError(where, f"architectures {names} name no DFlash drafter (expected "
                                   f"one of {', '.join(ARCHITECTURES)})")
    draft = hf.get("dflash_config") or {}

    def value(key, default=None):
        return draft.get(key, hf.get(key, default))

    if hf.get("attention_bias"):
        raise ArtifactError(where, "attention biases are not supported in DFlash drafters")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise ArtifactError(where, f"rope_type {rope.get('rope_type')!r} is not supported")
    layers = int(hf["num_hidden_layers"])
    kinds = tuple(hf.get("layer_types") or ("full_attention",) * layers)
    if len(set(kinds)) != 1:
        raise ArtifactError(where, "a drafter mixing layer types is not supported")
    sliding = kinds[0] == "sliding_attention"
    causal = hf.get("is_causal")
    heads = int(hf["num_attention_heads"])
    try:
        return DFlashConfig(
            variant=variants.pop(), num_layers=layers, hidden_size=int(hf["hidden_size"]),
            num_heads=heads, num_kv_heads=int(hf.get("num_key_value_heads", heads)),
            head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
            intermediate_size=int(hf["intermediate_size"]), vocab_size=int(hf["vocab_size"]),
            target_layer_ids=tuple(int(i) for i in value("target_layer_ids")),
            block_size=int(value("block_size", 16)), mask_token_id=int(value("mask_token_id")),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 1e6))),
            input_embedding_scale=float(value("input_embedding_scale", 1.0)),
            output_multiplier=float(value("output_multiplier", 1.0)),
            final_logit_softcapping=float(value("final_logit_softcapping") or 0.0),
            sliding_window=int(hf.get("sliding_window") or 0) if sliding else 0,
            causal=sliding if causal is None else bool(causal),
            conv_kernel_size=int(value("conv_kernel_size", 0) or 0),
            conv_group_size=int(value("conv_group_size", 0) or 0),
            selector_rank=int(value("selector_rank", 0) or 0),
            selector_top_k=int(value("selector_top_k", 0) or 0))
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(where, f"not a usable DFlash config ({exc})") from None


def read_dflash(directory: str | pathlib.Path, dtype: str) -> tuple[DFlashConfig, dict]:
    """(config, params tree) of a public DFlash / DFlash2 checkpoint directory, floats stored
    as `dtype` (norms f32)."""
    directory = pathlib.Path(directory)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ArtifactError(config_file, "missing (a DFlash checkpoint directory has "
                                         "config.json and *.safetensors)")
    config = dflash_config_from_hf(json.loads(config_file.read_text()), config_file)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ArtifactError(directory, "no *.safetensors files")
    tree: dict = {}
    for file in map(SafetensorsFile, files):
        for hf_name in file.names():
            if hf_name in _SHARED:
                continue
            name = _our_name(hf_name, file.path)
            array = np.asarray(file.get(hf_name))
            if name.rsplit(".", 1)[-1] in _TRANSPOSED or name in _TRANSPOSED:
                array = array.T
            full = f"{config.variant}.{name}"
            _place(tree, name, common.store(full, array, dtype), config.num_layers)
    _check_shapes(tree, config, directory)
    return config, tree


def _place(tree: dict, name: str, array, num_layers: int) -> None:
    """Put a drafter tensor at its dotted name (`layers.0.wq`, `selector.successor`)."""
    if name.startswith("selector."):
        tree.setdefault("selector", {})[name.split(".", 1)[1]] = array
    else:
        common.add_to_params(tree, name, array, num_layers)


def _our_name(hf_name: str, where: pathlib.Path) -> str:
    if hf_name in _TOP_NAMES:
        return _TOP_NAMES[hf_name]
    match = _LAYER.match(hf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"layers.{int(match.group(1))}.{_LAYER_NAMES[match.group(2)]}"
    raise ArtifactError(where, f"unknown DFlash tensor {hf_name}")


def _check_shapes(tree: dict, config: DFlashConfig, where: pathlib.Path) -> None:
    from ninfer_jax.artifact import weights_io

    for name, shape in config.expected_shapes().items():
        node = weights_io.subtree(tree, name)
        if node is None or tuple(node.shape) != shape:
            found = None if node is None else tuple(node.shape)
            raise ArtifactError(where, f"tensor {name}: expected shape {shape}, found {found}")


def add_drafter(contents, config: DFlashConfig, tree: dict, dtype: str) -> None:
    """Put a drafter into ArtifactContents as its component (checked against the target)."""
    config.check_target(contents.config)
    contents.params[config.variant] = tree
    contents.components[config.variant] = True
    contents.dflash_configs[config.variant] = config
    contents.weight_formats[config.variant] = dtype


def add_draft_head(contents, vocab: int) -> None:
    """The reduced proposal head of --lm-head-draft: the target's output projection kept for
    token ids 0..vocab-1 (byte-level BPE vocabularies number their tokens roughly by merge
    order, so the low ids are the frequent ones)."""
    params, config = contents.params, contents.config
    group = "embed" if config.tie_word_embeddings else "lm_head"
    head = params[group]
    if isinstance(head, dict):  # quantized blocks (GGUF q8_0 / q4_1, int8, ...)
        raise ValueError("--lm-head-draft-vocab needs a float lm_head (this one is quantized)")
    if not 0 < vocab <= config.vocab_size:
        raise ValueError(f"--lm-head-draft-vocab {vocab}: choose 1..{config.vocab_size}")
    if config.tie_word_embeddings:
        head = head.T
    params[DRAFT_HEAD] = vocabulary_subset_head(head, range(vocab))
    contents.components[DRAFT_HEAD] = True
    contents.draft_head_vocab = vocab
    contents.weight_formats[DRAFT_HEAD] = contents.weight_formats[group]


# ----------------------------------------------------------------------------- random drafters


def preset_dflash_config(config: ModelConfig, variant: str, *, tiny: bool) -> DFlashConfig:
    """The drafter init-random gives a preset (hybrid, or dense llama / qwen3 with
    --drafters): the published Qwen3.6-27B-DFlash shape (5 layers over target layers spread
    from 1 to L - 3, block 16) with the target's attention and MLP sizes; tiny: 2 layers. DFlash2 adds the public fixture's extras (conv
    taps 2 in groups of 16, a rank-256 selector over the top 16, window 2048, soft-cap 20),
    shrunk when tiny (window 8, so short tests cross it; rank 4)."""
    layers = 2 if tiny else 5
    last = max(config.num_layers - 3, 1)
    ids = sorted({min(round(1 + i * (last - 1) / max(layers - 1, 1)), config.num_layers - 1)
                  for i in range(layers)}) if config.num_layers > 2 else [0, config.num_layers - 1]
    v2 = variant == "dflash2"
    return DFlashConfig(
        variant=variant, num_layers=layers, hidden_size=config.hidden_size,
        num_heads=config.num_heads, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
        intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
        target_layer_ids=tuple(sorted(set(ids))), block_size=16,
        mask_token_id=config.vocab_size - 1, rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta, final_logit_softcapping=20.0 if v2 else 0.0,
        sliding_window=(8 if tiny else 2048) if v2 else 0,
        conv_kernel_size=2 if v2 else 0, conv_group_size=16 if v2 else 0,
        selector_rank=(4 if tiny else 256) if v2 else 0,
        selector_top_k=(8 if tiny else 16) if v2 else 0)


def random_dflash(config: DFlashConfig, *, seed: int, dtype: str) -> dict:
    """A drafter tree with random weights: norms ~ 1 (plain RMSNorm), projections
    N(0, 1/fan_in), conv kernels N(0, 0.3), codebooks N(0, 1/sqrt(rank))."""
    from ninfer_jax.artifact.random_init import random_tensor

    tree: dict = {}
    for name, shape in config.expected_shapes().items():
        full = f"{config.variant}.{name}"
        leaf = name.rsplit(".", 1)[-1]
        if leaf.endswith("norm"):
            array = random_tensor(seed, full, shape, 0.1, "f32", mean=1.0)
        elif leaf.endswith("_base"):
            array = random_tensor(seed, full, shape, 0.3, dtype)
        elif leaf in ("predecessor", "successor"):
            array = random_tensor(seed, full, shape, shape[1] ** -0.5, dtype)
        else:
            array = random_tensor(seed, full, shape, shape[0] ** -0.5, dtype)
        _place(tree, name, array, config.num_layers)
    return tree
