"""`ninfer init-random`: artifacts with random weights, a real Qwen tokenizer and our own
Qwen-style chat templates, for protocol tests (tiny presets) and GPU benchmarks (8B shapes).

Weights are seeded per tensor (the seed and the tensor name pick the stream), scaled so that
activations stay finite: projections ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norm weights
around 1. Tensors larger than a few million values repeat a seeded random block at a random
phase instead of drawing every value, so 8B-parameter presets generate in seconds per tensor.
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
from tokenizers import Tokenizer

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.artifact.format import ArtifactContents
from ninfer_jax.artifact.qwen_vocab import qwen_tokenizer_json
from ninfer_jax.artifact.templates import builtin_template
from ninfer_jax.model.config import ModelConfig

QWEN3_VOCAB = 151669  # 151,643 ranks + 26 control tokens
QWEN3_5_VOCAB = 248077  # 248,044 ranks + 33 control tokens
_BLOCK = 1 << 22  # values drawn per large tensor; the rest repeats them at a random phase
REASONING = {"open": "<think>", "close": "</think>"}


@dataclasses.dataclass(frozen=True)
class Preset:
    config: ModelConfig
    vocabulary: str  # qwen_vocab kind
    template: str  # templates/<name>.jinja
    tool_call_format: str
    dtype: str  # default storage dtype
    notes: str


def _dense(arch, vocab, hidden, ffn, layers, heads, kv_heads, head_dim, theta, eps, tied,
           max_positions):
    return ModelConfig(architecture=arch, vocab_size=vocab, hidden_size=hidden,
                       intermediate_size=ffn, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv_heads, head_dim=head_dim, rms_norm_eps=eps,
                       rope_theta=theta, tie_word_embeddings=tied, qk_norm=arch == "qwen3",
                       max_position_embeddings=max_positions)


PRESETS = {
    "qwen3-tiny": Preset(
        _dense("qwen3", QWEN3_VOCAB, 64, 128, 2, 4, 2, 16, 1e6, 1e-6, True, 40960),
        "qwen3", "qwen3", "hermes", "f32",
        "random weights; Qwen3 tokenizer and a Qwen3-style template written for ninfer-jax"),
    "qwen3.5-tiny": Preset(
        _dense("qwen3", QWEN3_5_VOCAB, 64, 128, 2, 4, 2, 16, 1e7, 1e-6, True, 40960),
        "qwen3_5", "qwen3_5", "qwen_xml", "f32",
        "random weights; Qwen3.5 tokenizer and template with a dense qwen3 body standing in "
        "for the hybrid Qwen3.5 architecture, which is not implemented yet"),
    "qwen3-8b": Preset(
        _dense("qwen3", 151936, 4096, 12288, 36, 32, 8, 128, 1e6, 1e-6, False, 40960),
        "qwen3", "qwen3", "hermes", "bf16", "random weights in Qwen3-8B shapes, for benchmarks"),
    "llama3-8b": Preset(
        _dense("llama", 128256, 4096, 14336, 32, 32, 8, 128, 500000.0, 1e-5, False, 8192),
        "qwen3", "qwen3", "hermes", "bf16",
        "random weights in Llama-3-8B shapes, for benchmarks; uses the Qwen3 tokenizer and "
        "template because no Llama-3 vocabulary is available offline (ids past the Qwen "
        "vocabulary are never produced since the model's vocabulary is smaller)"),
}


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
    shapes = config.expected_shapes()
    params: dict = {}
    for index, (name, shape) in enumerate(shapes.items(), start=1):
        if progress:
            progress(index, len(shapes), name)
        if name.endswith("norm"):
            array = random_tensor(seed, name, shape, 0.1, "f32", mean=1.0)
        elif name == "embed":
            array = random_tensor(seed, name, shape, 1.0, dtype)
        elif name == "lm_head":
            array = random_tensor(seed, name, shape, 2.0 / np.sqrt(shape[0]), dtype)
        else:
            array = random_tensor(seed, name, shape, 1.0 / np.sqrt(shape[0]), dtype)
        common.add_to_params(params, name, array, config.num_layers)
    return params


def init_random(preset_name: str, *, seed: int = 0, dtype: str | None = None,
                weights: str | None = None, name: str | None = None,
                progress: common.ProgressFn | None = None) -> ArtifactContents:
    """Artifact contents for a preset; `weights` may quantize the projection matrices."""
    if preset_name not in PRESETS:
        raise ValueError(f"unknown preset {preset_name!r}; choose one of {', '.join(PRESETS)}")
    preset = PRESETS[preset_name]
    dtype, quantized = common.resolve_formats(dtype, weights, default_dtype=preset.dtype)
    tokenizer_json = qwen_tokenizer_json(preset.vocabulary)
    tokenizer = Tokenizer.from_str(tokenizer_json)
    eos_ids = [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
    contents = ArtifactContents(
        name=name or preset_name, config=preset.config,
        params=random_params(preset.config, seed=seed, dtype=dtype, progress=progress),
        tokenizer_json=tokenizer_json, chat_template=builtin_template(preset.template),
        special_tokens=common.special_tokens(tokenizer, eos_ids=eos_ids, bos_id=None,
                                             pad_id=tokenizer.token_to_id("<|endoftext|>"),
                                             add_bos=False),
        chat_format={"tool_call_format": preset.tool_call_format, "reasoning": dict(REASONING),
                     "thinking_default": True},
        source={"kind": "random", "preset": preset_name, "seed": seed},
        weight_formats=common.weight_formats(preset.config, dtype, None),
        notes=preset.notes)
    return common.apply_quantization(contents, quantized, progress)
