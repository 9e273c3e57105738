"""`ninfer init-random`: artifacts with random weights, a real tokenizer built offline and our
own chat templates, for protocol tests (tiny presets) and GPU benchmarks (8B shapes).

Each preset fixes the architecture, the vocabulary (artifact/qwen_vocab.py: Qwen3, Qwen3.5, or
a Llama-3-layout stand-in), the special tokens, the chat template and format. `tiny=True`
keeps all of that and shrinks only the dimensions (hidden 64, 2 layers, 4 query heads with the
preset's grouping), so every preset can be built, loaded and served in CI.

Weights are seeded per tensor (the seed and the tensor name pick the stream), scaled so that
activations stay finite: projections ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norm weights
around 1. Tensors larger than a few million values repeat a seeded random block at a random
phase instead of drawing every value, so 8B-parameter presets generate in seconds per tensor.
"""
from __future__ import annotations

import dataclasses
import hashlib
import pathlib

import numpy as np
from tokenizers import Tokenizer

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.artifact.format import ArtifactContents, check_metadata
from ninfer_jax.artifact.qwen_vocab import qwen_tokenizer_json
from ninfer_jax.artifact.templates import builtin_template
from ninfer_jax.model.config import ModelConfig

QWEN3_VOCAB = 151669  # 151,643 ranks + 26 control tokens
QWEN3_5_VOCAB = 248077  # 248,044 ranks + 33 control tokens
LLAMA3_VOCAB = 128256  # 128,000 ranks + 256 control tokens
_BLOCK = 1 << 22  # values drawn per large tensor; the rest repeats them at a random phase
REASONING = {"open": "<think>", "close": "</think>"}
QWEN_EOS = ("<|im_end|>", "<|endoftext|>")  # end of turn first: it also ends a chat reply
# What `tiny` changes: dimensions only (the query heads keep the preset's grouping).
TINY_DIMS = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4,
             "head_dim": 16}


@dataclasses.dataclass(frozen=True)
class Preset:
    config: ModelConfig
    vocabulary: str  # qwen_vocab kind
    template: str  # templates/<name>.jinja
    tool_call_format: str
    dtype: str  # default storage dtype
    notes: str
    eos: tuple[str, ...] = QWEN_EOS  # spellings of the end tokens
    pad: str = "<|endoftext|>"
    bos: str | None = None  # written by the template; also prepended to raw prompts
    thinks: bool = True  # <think> reasoning markers, thinking unless the request says not


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
        _dense("llama", LLAMA3_VOCAB, 4096, 14336, 32, 32, 8, 128, 500000.0, 1e-5, False, 8192),
        "llama3", "llama3", "hermes", "bf16",
        "random weights in Llama-3-8B shapes, for benchmarks; a Llama-3-layout stand-in "
        "vocabulary (Qwen's first 128,000 BPE ranks plus Llama-3's 256 control tokens at "
        "their ids, since Meta's vocabulary is not available offline) and a Llama-3-style "
        "header template written for ninfer-jax, with hermes-style tool calls as text",
        eos=("<|eot_id|>", "<|end_of_text|>"), pad="<|end_of_text|>", bos="<|begin_of_text|>",
        thinks=False),
}


def tiny_config(config: ModelConfig) -> ModelConfig:
    """The same model at TINY_DIMS: vocabulary, norms, RoPE, tying, qk-norm and the query
    heads per KV head unchanged."""
    group = config.num_heads // config.num_kv_heads
    heads = TINY_DIMS["num_heads"]
    return dataclasses.replace(config, **TINY_DIMS, num_kv_heads=max(1, heads // group))


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
                weights: str | None = None, name: str | None = None, tiny: bool = False,
                progress: common.ProgressFn | None = None) -> ArtifactContents:
    """Artifact contents for a preset; `weights` may quantize the projection matrices and
    `tiny` shrinks the dimensions (everything else of the preset stays)."""
    if preset_name not in PRESETS:
        raise ValueError(f"unknown preset {preset_name!r}; choose one of {', '.join(PRESETS)}")
    preset = PRESETS[preset_name]
    config = tiny_config(preset.config) if tiny else preset.config
    dtype, quantized = common.resolve_formats(dtype, weights, default_dtype=preset.dtype)
    tokenizer_json = qwen_tokenizer_json(preset.vocabulary)
    tokenizer = Tokenizer.from_str(tokenizer_json)
    source = {"kind": "random", "preset": preset_name, "seed": seed}
    shrunk = config != preset.config  # --tiny on a tiny preset changes nothing
    if shrunk:
        source["tiny"] = True
    contents = ArtifactContents(
        name=name or (f"{preset_name}-tiny" if shrunk else preset_name), config=config,
        params={}, tokenizer_json=tokenizer_json, chat_template=builtin_template(preset.template),
        special_tokens=_special_tokens(preset, tokenizer), chat_format=_chat_format(preset),
        source=source, weight_formats=common.weight_formats(config, dtype, None),
        notes=preset.notes + ("; built with tiny dimensions (--tiny)" if shrunk else ""))
    # Checked before drawing weights, which takes minutes at 8B shapes.
    check_metadata(contents.metadata(), pathlib.Path(f"<init-random {preset_name}>"))
    contents.params = random_params(config, seed=seed, dtype=dtype, progress=progress)
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
            "reasoning": dict(REASONING) if preset.thinks else None,
            "thinking_default": preset.thinks}
