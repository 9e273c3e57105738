"""The byte-level BPE alphabet: GPT-2's reversible map from bytes to printable characters.

Shared by the tokenizer wrapper (text/tokenizer.py: byte fallbacks when decoding) and the
tokenizer builders (artifact/tokenizer_build.py), so it lives in the lower of the two layers.
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping
