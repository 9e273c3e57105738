"""`ninfer init-random`: artifacts with random weights, a real tokenizer built offline and our
own chat templates, for protocol tests (tiny presets) and GPU benchmarks (8B shapes).

Each preset (presets.py) fixes the architecture, the vocabulary (artifact/qwen_vocab.py: Qwen3,
Qwen3.5, or a Llama-3-, GLM-4.5-, Gemma-4- or Nemotron-H-layout stand-in), the special tokens,
the chat template and format.
`tiny=True` keeps all of that and shrinks only the dimensions (hidden 64, 2 layers, 4 query
heads with the preset's grouping), so every preset can be built and loaded in CI. Hybrid
presets also get their MTP head (the artifact's mtp component), random DFlash and DFlash2
drafters and a reduced proposal head (artifact/drafters.py; by default at tiny dimensions
only, `drafters=True` at any size); dense llama / qwen3 presets get the drafters and head
with `drafters=True` only,
and presets with a vision tower
their `vision` component (presets.tiny_vision when shrunk). Tower weights: LayerNorm weights
around 1, biases ~ N(0, 0.02), the learned positions ~ N(0, 0.1), matrices ~ N(0, 1/fan_in).

Weights are seeded per tensor (the seed and the tensor name pick the stream), scaled so that
activations stay finite: projections ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norm weights
around 1 (around 0 for the hybrids' zero-centred norms, applied as 1 + w), Gated DeltaNet
A_log ~ log U(1, 16) and dt_bias ~ N(0, 0.1) as the reference initialisation does, the
GLM router's correction bias ~ N(0, 0.1). Tensors larger than a few million values repeat a seeded random block at a random
phase instead of drawing every value, so 8B-parameter presets generate in seconds per tensor.
"""
from __future__ import annotations

import hashlib
import pathlib

import numpy as np
from tokenizers import Tokenizer

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.artifact.components import (VISION_PREFIX, add_vision_tensor,
                                            mtp_expected_shapes)
from ninfer_jax.artifact.components import DFLASH_VARIANTS
from ninfer_jax.artifact.format import ArtifactContents, check_metadata
from ninfer_jax.artifact.presets import (LLAMA3_VOCAB, PRESETS, QWEN3_5_VOCAB,  # noqa: F401
                                         QWEN3_VOCAB, TINY_DIMS, Preset, tiny_config,
                                         tiny_vision)
from ninfer_jax.artifact.qwen_vocab import qwen_tokenizer_json
from ninfer_jax.artifact.templates import builtin_template
from ninfer_jax.artifact.tensor_groups import is_norm
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.dflash_config import DENSE_TARGETS as DENSE_DFLASH_TARGETS
from ninfer_jax.model.vision.config import VisionConfig

DRAFT_HEAD_VOCAB = 32768  # the reduced proposal head's token ids: 0..this-1
_BLOCK = 1 << 22  # values drawn per large tensor; the rest repeats them at a random phase


def _stream(seed: int, name: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def random_tensor(seed: int, name: str, shape: tuple[int, ...], std: float, dtype: str,
                  mean: float = 0.0) -> np.ndarray:
    """A seeded random tensor in its storage dtype (norms f32, others `dtype`)."""
    rng = _stream(seed, name)
    size = int(np.prod(shape))
    drawn = min(size, _BLOCK)
    block = rng.standard_normal(drawn, dtype=np.float32) * np.float32(std) + np.float32(mean)
    block = common.store(name, block, dtype)
    if size > drawn:
        # One copying pass in the storage dtype: the block repeated from a random phase.
        block = np.resize(np.roll(block, int(rng.integers(drawn))), size)
    return block.reshape(shape)


def random_params(config: ModelConfig, *, seed: int, dtype: str,
                  progress: common.ProgressFn | None = None) -> dict:
    """Every tensor of `config` (its MTP head included) drawn as the module docstring says."""
    shapes = {**config.expected_shapes(), **mtp_expected_shapes(config)}
    params: dict = {}
    for index, (name, shape) in enumerate(shapes.items(), start=1):
        if progress:
            progress(index, len(shapes), name)
        common.add_to_params(params, name, _draw(config, seed, name, shape, dtype),
                             config.num_layers)
    return params


def random_vision_params(vision: VisionConfig, *, seed: int, dtype: str) -> dict:
    """Every tensor of the tower, drawn as the module docstring says."""
    tree: dict = {}
    for name, shape in vision.expected_shapes(VISION_PREFIX).items():
        leaf = name.rsplit(".", 1)[-1]
        if is_norm(name):
            array = random_tensor(seed, name, shape, 0.1, "f32", mean=1.0)
        elif leaf.endswith("_bias") or leaf.startswith("b"):
            array = random_tensor(seed, name, shape, 0.02, dtype)
        elif leaf == "pos_embed":
            array = random_tensor(seed, name, shape, 0.1, dtype)
        else:
            array = random_tensor(seed, name, shape, 1.0 / np.sqrt(shape[0]), dtype)
        add_vision_tensor(tree, name[len(VISION_PREFIX):], array)
    return tree


def _draw(config: ModelConfig, seed: int, name: str, shape: tuple[int, ...],
          dtype: str) -> np.ndarray:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "A_log":
        rng = _stream(seed, name)
        return np.log(rng.uniform(1.0, 16.0, shape)).astype(np.float32)
    if leaf in ("layer_scalar", "D"):  # Gemma's residual scale, Mamba-2's skip (as at init)
        return np.ones(shape, np.float32)
    if leaf in ("dt_bias", "router_bias"):
        return random_tensor(seed, name, shape, 0.1, "f32")
    if is_norm(name):
        centred = config.is_hybrid and leaf != "gdn_norm"  # applied as 1 + w
        return random_tensor(seed, name, shape, 0.1, "f32", mean=0.0 if centred else 1.0)
    if name == "embed":
        return random_tensor(seed, name, shape, 1.0, dtype)
    if name == "lm_head":
        return random_tensor(seed, name, shape, 2.0 / np.sqrt(shape[0]), dtype)
    fan_in = shape[-2] if len(shape) == 3 else shape[0]  # stacked experts: [E, in, out]
    if leaf == "conv":
        fan_in = shape[0]  # K taps per channel
    return random_tensor(seed, name, shape, 1.0 / np.sqrt(fan_in), dtype)


def init_random(preset_name: str, *, seed: int = 0, dtype: str | None = None,
                weights: str | None = None, name: str | None = None, tiny: bool = False,
                progress: common.ProgressFn | None = None,
                drafters: bool | None = None) -> ArtifactContents:
    """Artifact contents for a preset; `weights` may quantize the projection matrices and
    `tiny` shrinks the dimensions (everything else of the preset stays). Hybrid presets get
    random DFlash and DFlash2 drafters and a reduced proposal head when `drafters` (None:
    at tiny dimensions only; full-size drafters add about 4 GB each in bf16 at 27B) (see
    artifact/drafters.py)."""
    if preset_name not in PRESETS:
        raise ValueError(f"unknown preset {preset_name!r}; choose one of {', '.join(PRESETS)}")
    preset = PRESETS[preset_name]
    config = tiny_config(preset.config) if tiny else preset.config
    dtype, quantized = common.resolve_formats(dtype, weights, default_dtype=preset.dtype)
    tokenizer_json = qwen_tokenizer_json(preset.vocabulary)
    tokenizer = Tokenizer.from_str(tokenizer_json)
    source = {"kind": "random", "preset": preset_name, "seed": seed}
    shrunk = config != preset.config  # --tiny on a tiny preset changes nothing
    vision = tiny_vision(preset.vision, config) if shrunk and preset.vision else preset.vision
    formats = common.weight_formats(config, dtype, None)
    if vision:
        formats["vision"] = dtype
    if shrunk:
        source["tiny"] = True
    contents = ArtifactContents(
        name=name or (f"{preset_name}-tiny" if shrunk else preset_name), config=config,
        params={}, tokenizer_json=tokenizer_json, chat_template=builtin_template(preset.template),
        special_tokens=_special_tokens(preset, tokenizer), chat_format=_chat_format(preset),
        source=source, weight_formats=formats, vision_config=vision,
        components={"text": True, "mtp": config.mtp_num_layers > 0, "dflash": False,
                    "dflash2": False, "draft_head": False, "vision": vision is not None},
        notes=preset.notes + ("; built with tiny dimensions (--tiny)" if shrunk else ""))
    # Checked before drawing weights, which takes minutes at 8B shapes.
    check_metadata(contents.metadata(), pathlib.Path(f"<init-random {preset_name}>"))
    contents.params = random_params(config, seed=seed, dtype=dtype, progress=progress)
    if vision:
        contents.params["vision"] = random_vision_params(vision, seed=seed, dtype=dtype)
    if drafters is None:  # by default tiny hybrid presets only; dense ones when asked
        drafters = config.is_hybrid and config.hidden_size <= 256
    if drafters and not (config.is_hybrid or config.architecture in DENSE_DFLASH_TARGETS):
        raise ValueError(f"--drafters: DFlash drafters serve hybrid and dense "
                         f"{' / '.join(DENSE_DFLASH_TARGETS)} models, not "
                         f"{config.architecture}")
    if drafters:
        from ninfer_jax.artifact.drafters import (add_draft_head, add_drafter,
                                                  preset_dflash_config, random_dflash)

        for variant in DFLASH_VARIANTS:
            drafter = preset_dflash_config(config, variant,
                                           tiny=config.hidden_size <= 256)
            add_drafter(contents, drafter, random_dflash(drafter, seed=seed, dtype=dtype), dtype)
        add_draft_head(contents, min(config.vocab_size, DRAFT_HEAD_VOCAB))
    return common.apply_quantization(contents, quantized, progress)


def _special_tokens(preset: Preset, tokenizer: Tokenizer) -> dict:
    def token_id(spelling: str) -> int:
        found = tokenizer.token_to_id(spelling)
        if found is None:  # a preset naming a token its vocabulary lacks is a bug here
            raise ValueError(f"vocabulary {preset.vocabulary!r} has no token {spelling!r}")
        return found

    bos_id = token_id(preset.bos) if preset.bos else None
    return common.special_tokens(tokenizer, eos_ids=[token_id(t) for t in preset.eos],
                                 bos_id=bos_id, pad_id=token_id(preset.pad),
                                 add_bos=bos_id is not None)


def _chat_format(preset: Preset) -> dict:
    return {"tool_call_format": preset.tool_call_format,
            "reasoning": dict(zip(("open", "close"), preset.markers)) if preset.thinks
            else None,
            "thinking_default": preset.thinks}
