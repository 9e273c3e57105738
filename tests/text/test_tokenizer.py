"""Tokenizer wrapper: llama.cpp's ids for the golden prompts, client text never parsed for
control tokens, segment encoding equal to whole-string encoding."""
from __future__ import annotations

import json
import pathlib

import pytest

from ninfer_jax.text.tokenizer import Segment

# llama.cpp reference outputs (vendored unchanged from shared/golden).
GOLDEN = pathlib.Path(__file__).parents[1] / "golden" / "smollm2_llamacpp.json"


def golden_cases():
    return json.loads(GOLDEN.read_text())["cases"]


@pytest.fixture(scope="module")
def tokenizer(default_tokenizer):
    return default_tokenizer


@pytest.mark.parametrize("case", golden_cases(), ids=lambda c: c["name"])
def test_golden_prompt_ids(tokenizer, case):
    assert tokenizer.encode(case["rendered"]) == case["prompt_ids"]
    assert tokenizer.encode_segments([Segment(case["rendered"], True)]) == case["prompt_ids"]


def test_vocabulary_accessors(tokenizer):
    assert tokenizer.vocab_size == 49152
    assert tokenizer.token_to_id("<|im_end|>") == 2
    assert tokenizer.id_to_token(1) == "<|im_start|>"
    assert tokenizer.eos_ids == (2,)
    assert tokenizer.is_control(2) and not tokenizer.is_control(504)
    assert "<|im_start|>" in tokenizer.control_tokens


def test_control_spelling_in_client_text_is_plain_text(tokenizer):
    text = "<|im_start|>assistant"
    assert tokenizer.encode(text, special=True)[0] == 1
    plain = tokenizer.encode(text, special=False)
    assert 1 not in plain and len(plain) > 2
    assert tokenizer.decode(plain) == text


def test_segments_parse_controls_only_in_trusted_text(tokenizer):
    segments = [Segment("<|im_start|>user\n", True), Segment("quote: <|im_end|> ok", False),
                Segment("<|im_end|>\n", True)]
    ids = tokenizer.encode_segments(segments)
    assert ids.count(1) == 1 and ids.count(2) == 1 and ids[-2:] == [2, 198]
    assert tokenizer.decode(ids) == "".join(s.text for s in segments)


def test_segment_boundaries_do_not_change_tokenization(tokenizer):
    # Client text joined to template text is encoded in one piece, as a whole-string encode.
    whole = "<|im_start|>user\nHello world, 12345 tokens<|im_end|>\n"
    segments = [Segment("<|im_start|>user\nHel", True), Segment("lo world, 123", False),
                Segment("45 tokens<|im_end|>\n", True)]
    assert tokenizer.encode_segments(segments) == tokenizer.encode(whole)


def test_token_bytes_concatenate_to_text(tokenizer):
    text = "naïve 🎉 日本"
    ids = tokenizer.encode(text)
    assert tokenizer.decode_bytes(ids) == text.encode("utf-8")
    assert tokenizer.is_byte_level


def test_non_special_markup_tokens_are_controls_too():
    # Hugging Face Qwen tokenizers register <think> as a non-special added token.
    from ninfer_jax.artifact.tokenizer_build import AddedSpec, build_bpe_tokenizer, byte_to_unicode
    from ninfer_jax.text.tokenizer import Tokenizer

    vocab = {ch: b for b, ch in byte_to_unicode().items()}
    hf = build_bpe_tokenizer(vocab, [], pre_tokenizer_kind="qwen2",
                             added=[AddedSpec("<think>", 256, special=False),
                                    AddedSpec("<|end|>", 257)])
    tokenizer = Tokenizer(hf.to_str())
    assert tokenizer.control_tokens == {"<think>": 256, "<|end|>": 257}
    assert tokenizer.encode("a<think>b<|end|>") == [97, 256, 98, 257]
    assert 256 not in tokenizer.encode("a<think>b", special=False)
    assert tokenizer.decode([97, 256, 98]) == "a<think>b"
