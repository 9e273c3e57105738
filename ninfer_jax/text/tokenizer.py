"""Tokenizer wrapper over a `tokenizers.Tokenizer` loaded from an artifact's tokenizer.json.

Two views of one vocabulary:
  * trusted text (chat-template output, raw completion prompts): control-token spellings such
    as `<|im_start|>` become their single control token;
  * client text (message content, tool data): control spellings are ordinary characters and
    are encoded byte-for-byte like any other text.
`encode_segments` mixes both in one prompt. Text is split only at control tokens that come
from trusted segments; every stretch in between (trusted and client text joined) is encoded
in one piece, so a prompt without quoted control spellings gets exactly the ids a plain
`encode` of the whole string gives (llama.cpp and Hugging Face split at control tokens too).

One `tokenizers` instance, permanently in its "control spellings are text" mode
(encode_special_tokens); the control-token split of trusted text is done here, the way the
library itself does it (leftmost, longest spelling first). Added tokens' lstrip/rstrip flags
are not applied. Thread-safe: the instance is only read after construction. No jax import.
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib
import re
from typing import Iterable, Sequence

import tokenizers

from ninfer_jax.text.byte_level import byte_to_unicode
from ninfer_jax.errors import ArtifactError

# Non-special added tokens that look like markup are treated as control tokens as well
# (Hugging Face Qwen tokenizers mark <think> and <tool_call> as non-special).
_CONTROL_LOOKING = re.compile(r"^<[^\s<>]+>$|^<\|.*\|>$")


@dataclasses.dataclass(frozen=True)
class Segment:
    text: str
    trusted: bool  # True: control-token spellings inside are parsed as control tokens


class Tokenizer:
    def __init__(self, tokenizer_json: str, *, eos_ids: Sequence[int] = (),
                 bos_id: int | None = None, add_bos: bool = False, source: str = "tokenizer"):
        self.source = source
        self._full = tokenizers.Tokenizer.from_str(tokenizer_json)
        added = self._full.get_added_tokens_decoder()
        self.control_tokens: dict[str, int] = {
            token.content: token_id for token_id, token in added.items() if _is_control(token)}
        _make_controls_special(self._full, added)
        # From here on the library encodes control spellings as text; split_segments decides
        # where real control tokens go.
        self._full.encode_special_tokens = True
        self._control_pattern = _alternation(self.control_tokens)
        self._added_spellings = {token_id: token.content.encode("utf-8")
                                 for token_id, token in added.items()}
        self._byte_of_char = {ch: b for b, ch in byte_to_unicode().items()}
        self.eos_ids = tuple(eos_ids)
        self.bos_id = bos_id
        self.add_bos = add_bos
        self._file: str | None = None  # set by from_file: then pickled by reference
        self._json: str | None = tokenizer_json

    def __reduce__(self):
        # Token policies hold a tokenizer and cross to the engine-core process with every
        # request: a file-backed one travels as its path (loaded once per process there),
        # not as its multi-megabyte vocabulary.
        options = (self.eos_ids, self.bos_id, self.add_bos)
        if self._file is not None:
            return _cached_from_file, (self._file, *options)
        return _from_json, (self._json, self.source, *options)

    @classmethod
    def from_file(cls, path: str | pathlib.Path, **kwargs) -> "Tokenizer":
        path = pathlib.Path(path)
        try:
            tokenizer = cls(path.read_text(encoding="utf-8"), source=str(path), **kwargs)
            tokenizer._file, tokenizer._json = str(path), None
            return tokenizer
        except FileNotFoundError:
            raise ArtifactError(path, "missing") from None
        except Exception as exc:  # tokenizers raises plain Exception on malformed JSON
            raise ArtifactError(path, f"not a valid tokenizer ({exc})") from None

    @classmethod
    def from_artifact(cls, artifact) -> "Tokenizer":
        special = artifact.metadata["special_tokens"]
        return cls.from_file(artifact.tokenizer_path, eos_ids=special["eos_ids"],
                             bos_id=special.get("bos_id"), add_bos=special.get("add_bos", False))

    # ------------------------------------------------------------------ vocabulary

    @property
    def vocab_size(self) -> int:
        return self._full.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._full.token_to_id(token)

    @functools.cached_property
    def max_chars_per_token(self) -> int:
        """An upper bound on the characters of text one token stands for: the longest vocabulary
        spelling, doubled for normalizers that drop characters. A text longer than
        N * this cannot encode to N tokens or fewer, which lets a prompt far past the context
        be refused without tokenizing it."""
        return 2 * max(len(token) for token in self._full.get_vocab(with_added_tokens=True))

    def may_fit(self, num_chars: int, max_tokens: int) -> bool:
        """False when `num_chars` of text surely encode to more than `max_tokens` tokens."""
        return num_chars <= max_tokens * self.max_chars_per_token

    def id_to_token(self, token_id: int) -> str | None:
        return self._full.id_to_token(token_id)

    def is_control(self, token_id: int) -> bool:
        return self.id_to_token(token_id) in self.control_tokens

    # ------------------------------------------------------------------ encode / decode

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """Ids of `text`; special=False encodes control spellings as plain text. Never adds BOS
        (callers that want it check `add_bos`)."""
        return self.encode_segments([Segment(text, special)])

    def encode_segments(self, segments: Iterable[Segment]) -> list[int]:
        """Ids of the concatenated segments; only trusted segments produce control tokens."""
        return [token_id for piece_ids in self.encode_pieces(self.split_segments(segments))
                for token_id in piece_ids]

    def encode_pieces(self, pieces: Sequence[tuple[str, int | None]]) -> list[list[int]]:
        """Ids of each piece from `split_segments` (one id for a control piece)."""
        # Sequential on purpose: encode_batch starts a thread pool, which misbehaves after fork.
        return [[control_id] if control_id is not None
                else self._full.encode(text, add_special_tokens=False).ids
                for text, control_id in pieces]

    def split_segments(self, segments: Iterable[Segment]) -> list[tuple[str, int | None]]:
        """The prompt as pieces: (text, None) to encode as text, or (spelling, control id)."""
        pieces: list[tuple[str, int | None]] = []
        pending: list[str] = []
        for segment in segments:
            if not segment.trusted or self._control_pattern is None:
                pending.append(segment.text)
                continue
            cursor = 0
            for match in self._control_pattern.finditer(segment.text):
                pending.append(segment.text[cursor:match.start()])
                if "".join(pending):
                    pieces.append(("".join(pending), None))
                pending = []
                pieces.append((match.group(), self.control_tokens[match.group()]))
                cursor = match.end()
            pending.append(segment.text[cursor:])
        if "".join(pending):
            pieces.append(("".join(pending), None))
        return pieces

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        return self._full.decode(list(ids), skip_special_tokens=skip_special)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The exact bytes of `ids` (byte-level tokens may hold part of a UTF-8 character)."""
        return b"".join(self.token_bytes(token_id) for token_id in ids)

    def token_bytes(self, token_id: int) -> bytes:
        """One token's bytes: added tokens are their spelling, byte-level vocabulary entries map
        back through the byte alphabet (possibly an incomplete UTF-8 sequence)."""
        if token_id in self._added_spellings:
            return self._added_spellings[token_id]
        token = self.id_to_token(token_id)
        if token is None:
            # Model vocabularies are often padded past the tokenizer's (Qwen3-8B: 151,936 rows
            # for 151,669 tokens); such ids have no text, as in `decode`.
            return b""
        try:
            return bytes(self._byte_of_char[ch] for ch in token)
        except KeyError:
            return self._full.decode([token_id]).encode("utf-8")

    @property
    def is_byte_level(self) -> bool:
        """True when every token maps to exact bytes (`token_bytes` is exact)."""
        return self._byte_of_char is not None and "ByteLevel" in type(self._full.decoder).__name__


@functools.lru_cache(maxsize=8)
def _cached_from_file(path: str, eos_ids: tuple, bos_id, add_bos: bool) -> Tokenizer:
    return Tokenizer.from_file(path, eos_ids=eos_ids, bos_id=bos_id, add_bos=add_bos)


def _from_json(tokenizer_json: str, source: str, eos_ids: tuple, bos_id,
               add_bos: bool) -> Tokenizer:
    return Tokenizer(tokenizer_json, eos_ids=eos_ids, bos_id=bos_id, add_bos=add_bos,
                     source=source)


def _is_control(token: tokenizers.AddedToken) -> bool:
    return token.special or bool(_CONTROL_LOOKING.match(token.content))


def _make_controls_special(tokenizer: tokenizers.Tokenizer, added: dict) -> None:
    """Re-register control-looking non-special added tokens as special (same ids), so that
    encode_special_tokens treats their spellings as text too."""
    for token_id, token in added.items():
        if _is_control(token) and not token.special:
            tokenizer.add_special_tokens([tokenizers.AddedToken(
                token.content, special=True, normalized=token.normalized, lstrip=token.lstrip,
                rstrip=token.rstrip, single_word=token.single_word)])
            if tokenizer.token_to_id(token.content) != token_id:
                raise ValueError(f"control token {token.content!r} changed id")


def _alternation(spellings: Iterable[str]) -> re.Pattern | None:
    # Longest first, so "<|im_start|>" wins over any shorter spelling that is its prefix.
    ordered = sorted(spellings, key=len, reverse=True)
    return re.compile("|".join(re.escape(s) for s in ordered)) if ordered else None
