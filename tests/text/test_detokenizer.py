"""Incremental detokenizer: never emits broken UTF-8, whatever the split of the ids."""
from __future__ import annotations

import pytest

from ninfer_jax.text.detokenizer import IncrementalDetokenizer

MULTIBYTE = "Grüße 🎉🎉 日本語 café — ñ 👩‍👩‍👧"


def test_token_by_token_equals_decode(default_tokenizer):
    ids = default_tokenizer.encode(MULTIBYTE)
    assert len(ids) > len(MULTIBYTE.split())  # some characters span several tokens
    detok = IncrementalDetokenizer(default_tokenizer)
    pieces = [detok.push([token_id]) for token_id in ids] + [detok.flush()]
    assert "".join(pieces) == default_tokenizer.decode(ids) == MULTIBYTE
    assert "\ufffd" not in "".join(pieces)
    assert any(piece == "" for piece in pieces)  # partial characters were held back


def test_every_split_point(default_tokenizer):
    ids = default_tokenizer.encode(MULTIBYTE)
    for split in range(len(ids) + 1):
        detok = IncrementalDetokenizer(default_tokenizer)
        first = detok.push(ids[:split])
        second = detok.push(ids[split:])
        assert "\ufffd" not in first + second
        assert first + second + detok.flush() == MULTIBYTE
        assert MULTIBYTE.startswith(first)


def test_dangling_partial_character_flushes_as_replacement(default_tokenizer):
    ids = default_tokenizer.encode("🎉")
    assert len(ids) > 1
    detok = IncrementalDetokenizer(default_tokenizer)
    assert detok.push(ids[:-1]) == ""
    assert detok.flush() == "\ufffd" == default_tokenizer.decode(ids[:-1])


def test_control_tokens_pass_through_or_skip(default_tokenizer):
    ids = default_tokenizer.encode("Hi<|im_end|>")
    assert IncrementalDetokenizer(default_tokenizer).push(ids) == "Hi<|im_end|>"
    assert IncrementalDetokenizer(default_tokenizer, skip_special=True).push(ids) == "Hi"


def test_window_fallback_for_non_byte_level_vocabularies():
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

    from ninfer_jax.text.tokenizer import Tokenizer

    vocab = {"<unk>": 0, "▁hello": 1, "▁world": 2, "▁": 3, "!": 4}
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    tokenizer = Tokenizer(hf.to_str())
    assert not tokenizer.is_byte_level
    ids = [1, 2, 4]
    detok = IncrementalDetokenizer(tokenizer)
    text = "".join(detok.push([i]) for i in ids) + detok.flush()
    assert text == tokenizer.decode(ids) == "hello world!"


def test_ids_past_the_tokenizer_vocabulary_have_no_text(default_tokenizer):
    # Padded model vocabularies can sample ids the tokenizer does not have.
    detok = IncrementalDetokenizer(default_tokenizer)
    ids = default_tokenizer.encode("Hi") + [default_tokenizer.vocab_size + 5]
    assert detok.push(ids) + detok.flush() == "Hi" == default_tokenizer.decode(ids)
