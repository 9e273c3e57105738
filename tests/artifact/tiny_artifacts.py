"""Tiny artifacts for format tests: a byte-level tokenizer with three ChatML control tokens
and random weights for a two-layer llama config."""
from __future__ import annotations

import numpy as np

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.artifact.format import ArtifactContents
from ninfer_jax.artifact.templates import builtin_template
from ninfer_jax.artifact.tokenizer_build import AddedSpec, build_bpe_tokenizer, byte_to_unicode
from ninfer_jax.model.config import ModelConfig

CONTROLS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_tokenizer():
    """256 byte tokens, a handful of merges, then the control tokens (ids 260..262)."""
    vocab = {ch: b for b, ch in byte_to_unicode().items()}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    added = [AddedSpec(text, len(vocab) + i) for i, text in enumerate(CONTROLS)]
    return build_bpe_tokenizer(vocab, merges, pre_tokenizer_kind="qwen2", added=added)


def tiny_config(**overrides) -> ModelConfig:
    fields = dict(architecture="llama", vocab_size=264, hidden_size=16, intermediate_size=32,
                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4)
    fields.update(overrides)
    return ModelConfig(**fields)


def random_params(config: ModelConfig, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    params: dict = {}
    for name, shape in config.expected_shapes().items():
        common.add_to_params(params, name, rng.standard_normal(shape).astype(np.float32),
                             config.num_layers)
    return params


def tiny_contents(config: ModelConfig | None = None, params: dict | None = None) -> ArtifactContents:
    config = config or tiny_config()
    tokenizer = byte_tokenizer()
    template = builtin_template("chatml")
    return ArtifactContents(
        name="tiny-llama", config=config,
        params=params if params is not None else random_params(config),
        tokenizer_json=tokenizer.to_str(), chat_template=template,
        special_tokens=common.special_tokens(tokenizer, eos_ids=[tokenizer.token_to_id("<|im_end|>")],
                                             bos_id=None, pad_id=None, add_bos=False),
        chat_format=common.detect_chat_format(template, tokenizer),
        source={"kind": "test"}, weight_formats=common.float_weight_formats(config, "f32"))
