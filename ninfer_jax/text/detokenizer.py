"""Incremental detokenizer: token ids in, only complete UTF-8 text out.

Byte-level BPE tokens can end in the middle of a multi-byte character (an emoji is often two
or three tokens). `push` returns the text that is complete so far and holds back a partial
byte sequence until the next token completes it; `flush` ends the stream and turns a dangling
partial sequence into U+FFFD, as `Tokenizer.decode` would.

For byte-level vocabularies this works on bytes (exact, linear time). Other vocabularies
(e.g. SentencePiece-style) fall back to re-decoding a short window of recent tokens and
emitting the new suffix once it no longer ends in U+FFFD.

One instance per output stream; not shared between threads.
"""
from __future__ import annotations

import codecs
from typing import Iterable

from ninfer_jax.text.tokenizer import Tokenizer

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._byte_level = tokenizer.is_byte_level
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # Window state of the re-decoding fallback.
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, ids: Iterable[int]) -> str:
        ids = [i for i in ids if not (self.skip_special and self.tokenizer.is_control(i))]
        if self._byte_level:
            data = b"".join(self.tokenizer.token_bytes(i) for i in ids)
            return self._utf8.decode(data, final=False)
        self._ids.extend(ids)
        return self._window_text(final=False)

    def flush(self) -> str:
        if self._byte_level:
            return self._utf8.decode(b"", final=True)
        return self._window_text(final=True)

    def _window_text(self, *, final: bool) -> str:
        decode = self.tokenizer.decode
        before = decode(self._ids[self._prefix_offset:self._read_offset])
        current = decode(self._ids[self._prefix_offset:])
        if len(current) <= len(before) or (current.endswith(REPLACEMENT) and not final):
            return ""
        # Keep the last emitted tokens as context: decoders such as Metaspace drop a leading
        # space at the start of a decode, so decoding the new tokens alone would lose it.
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return current[len(before):]
