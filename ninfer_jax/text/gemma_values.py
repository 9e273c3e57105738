"""The argument object of a Gemma 4 tool call: `{key:VALUE,...}` with unquoted keys and
strings between `<|"|>` quotes, as the model writes it after `<|tool_call>call:NAME`.

`read_object(text, pos)` parses the object starting at text[pos] ('{') into Python values
and returns (value, end). Values: <|"|>strings<|"|> (taken verbatim, no escapes), JSON strings
"..." (a model may write them), numbers, true / false / null, nested objects and arrays.
It raises `Incomplete` when the text ends inside the object (more text may complete it) and
`Malformed` when it cannot become an object; `has_duplicates` on the returned dicts says
whether a key was written twice at that level.
"""
from __future__ import annotations

import json
import re

QUOTE = '<|"|>'
_KEY = re.compile(r"[A-Za-z_][\w.\-]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_WORDS = {"true": True, "false": False, "null": None}


class Incomplete(Exception):
    pass


class Malformed(Exception):
    pass


class GemmaObject(dict):
    has_duplicates = False


def read_object(text: str, pos: int):
    return _Reader(text).object(pos)


class _Reader:
    def __init__(self, text: str):
        self.text = text

    def _skip(self, pos: int) -> int:
        while pos < len(self.text) and self.text[pos].isspace():
            pos += 1
        if pos >= len(self.text):
            raise Incomplete
        return pos

    def object(self, pos: int):
        obj, pos = GemmaObject(), self._skip(pos + 1)
        if self.text[pos] == "}":
            return obj, pos + 1
        while True:
            key, pos = self._key(self._skip(pos))
            pos = self._skip(pos)
            if self.text[pos] != ":":
                raise Malformed
            value, pos = self.value(self._skip(pos + 1))
            obj.has_duplicates |= key in obj
            obj[key] = value
            pos = self._skip(pos)
            if self.text[pos] == "}":
                return obj, pos + 1
            if self.text[pos] != ",":
                raise Malformed
            pos += 1

    def _key(self, pos: int):
        if self.text.startswith(QUOTE, pos) or self.text[pos] == '"':
            key, end = self.value(pos)
            return key, end
        match = _KEY.match(self.text, pos)
        if not match:
            raise Malformed
        if match.end() == len(self.text):
            raise Incomplete
        return match.group(), match.end()

    def value(self, pos: int):
        text, char = self.text, self.text[pos]
        if char == "{":
            return self.object(pos)
        if char == "[":
            return self._array(pos)
        if text.startswith(QUOTE, pos):
            close = text.find(QUOTE, pos + len(QUOTE))
            if close < 0:
                raise Incomplete
            return text[pos + len(QUOTE):close], close + len(QUOTE)
        if QUOTE.startswith(text[pos:]):
            raise Incomplete
        if char == '"':
            try:
                return json.JSONDecoder().raw_decode(text, pos)
            except ValueError:
                raise (Incomplete if '"' not in text[pos + 1:] else Malformed) from None
        return self._scalar(pos)

    def _array(self, pos: int):
        items, pos = [], self._skip(pos + 1)
        if self.text[pos] == "]":
            return items, pos + 1
        while True:
            value, pos = self.value(self._skip(pos))
            items.append(value)
            pos = self._skip(pos)
            if self.text[pos] == "]":
                return items, pos + 1
            if self.text[pos] != ",":
                raise Malformed
            pos += 1

    def _scalar(self, pos: int):
        rest = self.text[pos:]
        for word, value in _WORDS.items():
            if rest.startswith(word):
                if len(rest) == len(word):
                    raise Incomplete  # "true" may still become "true," or "truex"
                return value, pos + len(word)
            if word.startswith(rest):
                raise Incomplete
        match = _NUMBER.match(self.text, pos)
        if not match:
            raise Incomplete if rest == "-" else Malformed
        if not self.text[match.end():].strip("0123456789.eE+-"):
            raise Incomplete  # the text ends in the number ("1", "1.", "1e-"): more may follow
        number = match.group()
        return (float(number) if any(c in number for c in ".eE") else int(number)), match.end()
