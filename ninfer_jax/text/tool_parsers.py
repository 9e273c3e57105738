"""Parsers for one tool call written by the model, in the three formats our templates use.

- hermes (Qwen3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
- qwen_xml (Qwen3.5/3.6): `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>
  \\n</function>\\n</tool_call>`, values typed by the tool schema (text/tool_values.py).
- glm_xml (GLM-4.5 and later): `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>
  \\n...</tool_call>`, values typed by the schema as for qwen_xml.
- gemma4 (Gemma 4): `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:5}<tool_call|>`, the object
  read by text/gemma_values.py (values carry their own types).
- nemotron (Nemotron-H / Nemotron Nano 2): `<TOOLCALL>[{"name": ..., "arguments": {...}},
  ...]</TOOLCALL>`, one opener holding a JSON list of calls (a scan returns them all).

`scan_call(text, pos, final)` reads the call that starts at `text[pos]` (the opener) and says
whether it is complete (with its end offset and the parsed call), still incomplete (more text
may complete it; only when not `final`), or invalid with a stable fallback reason:

    malformed_structure  the markup does not follow the format
    duplicate_parameter  one parameter written twice
    invalid_tool_name    the name cannot be a tool identity
    undeclared_tool      a well-formed name that is not an offered tool
(trailing_content, text after the calls, is decided by the region scanner in tool_stream.py.)

Both formats are parsed structurally, never by searching for the first closing tag: a string
parameter may legitimately contain `</tool_call>` or balanced `<parameter=..>..</parameter>`.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping

from ninfer_jax.text import gemma_values
from ninfer_jax.text.conversation import ToolSpec
from ninfer_jax.text.tool_values import OMIT, type_parameter

OPENER = "<tool_call>"
CLOSER = "</tool_call>"
MALFORMED = "malformed_structure"
DUPLICATE_PARAMETER = "duplicate_parameter"
INVALID_TOOL_NAME = "invalid_tool_name"
UNDECLARED_TOOL = "undeclared_tool"
TRAILING_CONTENT = "trailing_content"
FALLBACK_REASONS = (MALFORMED, DUPLICATE_PARAMETER, INVALID_TOOL_NAME, UNDECLARED_TOOL,
                    TRAILING_CONTENT)
INCOMPLETE, COMPLETE, INVALID = "incomplete", "complete", "invalid"
_TOOL_NAME = re.compile(r"[\w.:\-]{1,256}")


@dataclasses.dataclass(frozen=True)
class ParsedCall:
    name: str  # the qualified name as written (namespace.function for namespaced tools)
    arguments: str  # JSON object text, members in the order the model wrote them
    omitted_empty: int = 0  # empty values of non-string parameters left out
    schema_mismatches: int = 0  # values kept although their type is not the declared one


@dataclasses.dataclass(frozen=True)
class Scan:
    status: str  # INCOMPLETE, COMPLETE or INVALID
    end: int = 0
    call: ParsedCall | None = None
    reason: str | None = None
    more: tuple[ParsedCall, ...] = ()  # further calls under the same opener (nemotron)

    @property
    def calls(self) -> list[ParsedCall]:
        return [self.call, *self.more] if self.call is not None else []


_INCOMPLETE = Scan(INCOMPLETE)


def _invalid(reason: str = MALFORMED) -> Scan:
    return Scan(INVALID, reason=reason)


def skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _expect(text: str, pos: int, literal: str, final: bool) -> Scan | int:
    """The position after `literal` at `pos`, or the Scan explaining why it is not there."""
    if text.startswith(literal, pos):
        return pos + len(literal)
    if not final and literal.startswith(text[pos:]):
        return _INCOMPLETE
    return _invalid()


def _identity_problem(name: str, tools: Mapping[str, ToolSpec]) -> str | None:
    if not _TOOL_NAME.fullmatch(name):
        return INVALID_TOOL_NAME
    if name not in tools:
        return UNDECLARED_TOOL
    return None


class _Format:
    opener = OPENER
    closer = CLOSER
    call_prefix = ""  # what a forced call writes before the tool name
    name_terminator = ""  # what ends the name in that text

    def __init__(self, tools: Mapping[str, ToolSpec]):
        self.tools = dict(tools)

    def scan_call(self, text: str, pos: int, final: bool) -> Scan:
        raise NotImplementedError

    def _close(self, text: str, pos: int, final: bool, call: ParsedCall) -> Scan:
        after = _expect(text, skip_ws(text, pos), CLOSER, final)
        if isinstance(after, Scan):
            return after
        problem = _identity_problem(call.name, self.tools)
        return _invalid(problem) if problem else Scan(COMPLETE, after, call)


# ----------------------------------------------------------------------------- hermes JSON


class _JsonObject(dict):
    has_duplicates = False


def _object_hook(pairs):
    obj = _JsonObject(pairs)
    obj.has_duplicates = len(obj) != len(pairs)
    return obj


def _json_value_end(text: str, pos: int, closer: str = CLOSER) -> int | None:
    """End of the JSON object or list starting at text[pos], None if not closed yet.
    Raises ValueError when the tool-call `closer` appears outside a string before it closes."""
    depth, in_string, escaped = 0, False, False
    for index in range(pos, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return index + 1
        elif text.startswith(closer, index):
            raise ValueError("closer inside the JSON value")
    return None


class HermesFormat(_Format):
    call_prefix = OPENER + '\n{"name": "'
    name_terminator = '"'

    def scan_call(self, text: str, pos: int, final: bool) -> Scan:
        start = skip_ws(text, pos + len(OPENER))
        if start >= len(text):
            return _invalid() if final else _INCOMPLETE
        if text[start] != "{":
            return _invalid()
        try:
            end = _json_value_end(text, start)
        except ValueError:
            return _invalid()
        if end is None:
            return _invalid() if final else _INCOMPLETE
        try:
            obj = json.loads(text[start:end], object_pairs_hook=_object_hook)
        except ValueError:
            return _invalid()
        call = self._call_from(obj)
        return call if isinstance(call, Scan) else self._close(text, end, final, call)

    @staticmethod
    def _call_from(obj: Any) -> ParsedCall | Scan:
        name = obj.get("name")
        arguments = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments, object_pairs_hook=_object_hook)
            except ValueError:
                return _invalid()
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return _invalid()
        if obj.has_duplicates or getattr(arguments, "has_duplicates", False):
            return _invalid(DUPLICATE_PARAMETER)
        return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


# ----------------------------------------------------------------------------- Qwen XML

_FUNCTION_OPEN, _FUNCTION_CLOSE = "<function=", "</function>"
_PARAM_OPEN, _PARAM_CLOSE = "<parameter=", "</parameter>"


def _read_tag_name(text: str, pos: int, final: bool) -> tuple[str, int] | Scan:
    """The NAME of `<tag=NAME>` whose '=' ends at pos, and the position after '>'."""
    end = text.find(">", pos)
    if end < 0:
        partial = text[pos:]
        return _invalid() if final or "\n" in partial or "<" in partial else _INCOMPLETE
    return text[pos:end], end + 1


def _parameter_value_end(text: str, pos: int, final: bool) -> tuple[int, int] | Scan:
    """Value span end and position after its closing tag; nested tags must balance."""
    depth, scan = 1, pos
    while True:
        close = text.find(_PARAM_CLOSE, scan)
        if close < 0:
            return _invalid() if final else _INCOMPLETE
        nested = text.find(_PARAM_OPEN, scan)
        if 0 <= nested < close:
            depth, scan = depth + 1, nested + len(_PARAM_OPEN)
            continue
        depth -= 1
        if depth == 0:
            return close, close + len(_PARAM_CLOSE)
        scan = close + len(_PARAM_CLOSE)


def _trim_framing_newlines(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    return value[:-1] if value.endswith("\n") else value


class QwenXmlFormat(_Format):
    call_prefix = OPENER + "\n" + _FUNCTION_OPEN
    name_terminator = ">"

    call_close = _FUNCTION_CLOSE  # after the last parameter

    def scan_call(self, text: str, pos: int, final: bool) -> Scan:
        """The call at `pos` (its opener): name, parameters up to `call_close`, then the
        format's end of call; the same checks on the name and parameters in every XML form."""
        named = self._scan_name(text, pos, final)
        if isinstance(named, Scan):
            return named
        name, pos = named
        raw_params: list[tuple[str, str]] = []
        while True:
            pos = skip_ws(text, pos)
            if text.startswith(self.call_close, pos):
                pos += len(self.call_close)
                break
            param = self._scan_param(text, pos, final)
            if isinstance(param, Scan):
                return param
            param_name, value, pos = param
            raw_params.append((param_name, value))
        after = self._scan_end(text, pos, final)
        if isinstance(after, Scan):
            return after
        problem = _identity_problem(name, self.tools)
        if problem:
            return _invalid(problem)
        names = [param_name for param_name, _ in raw_params]
        if len(set(names)) != len(names):
            return _invalid(DUPLICATE_PARAMETER)
        return Scan(COMPLETE, after, self._typed_call(name, raw_params))

    def _scan_name(self, text: str, pos: int, final: bool) -> tuple[str, int] | Scan:
        pos = _expect(text, skip_ws(text, pos + len(OPENER)), _FUNCTION_OPEN, final)
        if isinstance(pos, Scan):
            return pos
        return _read_tag_name(text, pos, final)

    def _scan_param(self, text: str, pos: int, final: bool) -> tuple[str, str, int] | Scan:
        """(name, raw value, position after it) of the parameter at `pos`."""
        if not text.startswith(_PARAM_OPEN, pos):
            rest = text[pos:]
            maybe = _PARAM_OPEN.startswith(rest) or _FUNCTION_CLOSE.startswith(rest)
            return _INCOMPLETE if maybe and not final else _invalid()
        param = _read_tag_name(text, pos + len(_PARAM_OPEN), final)
        if isinstance(param, Scan):
            return param
        param_name, value_start = param
        span = _parameter_value_end(text, value_start, final)
        if isinstance(span, Scan):
            return span
        value_end, pos = span
        return param_name, _trim_framing_newlines(text[value_start:value_end]), pos

    def _scan_end(self, text: str, pos: int, final: bool) -> int | Scan:
        return _expect(text, skip_ws(text, pos), CLOSER, final)

    def _typed_call(self, name: str, raw_params: list[tuple[str, str]]) -> ParsedCall:
        schema = self.tools[name].parameters
        properties = schema.get("properties") if isinstance(schema, dict) else None
        properties = properties if isinstance(properties, dict) else {}
        arguments: dict[str, Any] = {}
        omitted = mismatched = 0
        for param_name, text in raw_params:
            typed = type_parameter(text, properties.get(param_name))
            if typed.value is OMIT:
                omitted += 1
                continue
            mismatched += typed.schema_mismatch
            arguments[param_name] = typed.value
        return ParsedCall(name, json.dumps(arguments, ensure_ascii=False), omitted, mismatched)


# ----------------------------------------------------------------------------- GLM XML

_KEY_OPEN, _KEY_CLOSE = "<arg_key>", "</arg_key>"
_VALUE_OPEN, _VALUE_CLOSE = "<arg_value>", "</arg_value>"


def _glm_name(text: str, pos: int, final: bool) -> tuple[str, int] | Scan:
    """The tool name after the opener (up to its newline or the first tag) and where it ends."""
    start = skip_ws(text, pos)
    ends = [i for i in (text.find("\n", start), text.find("<", start)) if i >= 0]
    if not ends:
        return _invalid() if final else _INCOMPLETE
    return text[start:min(ends)].strip(), min(ends)


def _glm_value_end(text: str, pos: int, final: bool) -> tuple[int, int] | Scan:
    """The value span's end and the position after its closer. A value may itself contain
    `</arg_value>`: the closer is the first one followed by the next key or the call's end."""
    scan = pos
    while True:
        close = text.find(_VALUE_CLOSE, scan)
        if close < 0:
            return _invalid() if final else _INCOMPLETE
        after = close + len(_VALUE_CLOSE)
        rest = text[skip_ws(text, after):]
        if rest.startswith((_KEY_OPEN, CLOSER)):
            return close, after
        if not final and (_KEY_OPEN.startswith(rest) or CLOSER.startswith(rest)):
            return _INCOMPLETE  # empty or a partial tag: the next text decides
        scan = after


class GlmXmlFormat(QwenXmlFormat):
    call_prefix = OPENER
    name_terminator = "\n"

    call_close = CLOSER  # the parameters end with the call itself

    def _scan_name(self, text: str, pos: int, final: bool) -> tuple[str, int] | Scan:
        return _glm_name(text, pos + len(OPENER), final)

    def _scan_param(self, text: str, pos: int, final: bool) -> tuple[str, str, int] | Scan:
        key_start = _expect(text, pos, _KEY_OPEN, final)
        if isinstance(key_start, Scan):
            maybe = not final and CLOSER.startswith(text[pos:])
            return _INCOMPLETE if maybe else key_start
        key_end = text.find(_KEY_CLOSE, key_start)
        if key_end < 0:
            tag = text.find("<", key_start)
            maybe = tag < 0 or _KEY_CLOSE.startswith(text[tag:])
            return _INCOMPLETE if maybe and not final else _invalid()
        value_start = _expect(text, skip_ws(text, key_end + len(_KEY_CLOSE)), _VALUE_OPEN, final)
        if isinstance(value_start, Scan):
            return value_start
        span = _glm_value_end(text, value_start, final)
        if isinstance(span, Scan):
            return span
        value_end, pos = span
        return text[key_start:key_end].strip(), text[value_start:value_end], pos

    def _scan_end(self, text: str, pos: int, final: bool) -> int | Scan:
        return pos  # call_close was the call's closer


# ----------------------------------------------------------------------------- Gemma 4

GEMMA_OPENER, GEMMA_CLOSER, GEMMA_CALL = "<|tool_call>", "<tool_call|>", "call:"


class GemmaFormat(_Format):
    opener = GEMMA_OPENER
    closer = GEMMA_CLOSER
    call_prefix = GEMMA_OPENER + GEMMA_CALL
    name_terminator = "{"

    def scan_call(self, text: str, pos: int, final: bool) -> Scan:
        start = _expect(text, pos + len(GEMMA_OPENER), GEMMA_CALL, final)
        if isinstance(start, Scan):
            return start
        brace = text.find("{", start)
        if brace < 0:
            return _invalid() if final or "<" in text[start:] else _INCOMPLETE
        name = text[start:brace]
        try:
            arguments, end = gemma_values.read_object(text, brace)
        except gemma_values.Incomplete:
            return _invalid() if final else _INCOMPLETE
        except gemma_values.Malformed:
            return _invalid()
        after = _expect(text, end, GEMMA_CLOSER, final)
        if isinstance(after, Scan):
            return after
        problem = _identity_problem(name, self.tools)
        if problem:
            return _invalid(problem)
        if _has_duplicates(arguments):
            return _invalid(DUPLICATE_PARAMETER)
        return Scan(COMPLETE, after, ParsedCall(name, json.dumps(arguments, ensure_ascii=False)))


# ----------------------------------------------------------------------------- Nemotron

NEMOTRON_OPENER, NEMOTRON_CLOSER = "<TOOLCALL>", "</TOOLCALL>"


class NemotronFormat(_Format):
    opener = NEMOTRON_OPENER
    closer = NEMOTRON_CLOSER
    call_prefix = NEMOTRON_OPENER + '[{"name": "'
    name_terminator = '"'

    def scan_call(self, text: str, pos: int, final: bool) -> Scan:
        """Every call of the JSON list after the opener; each is read as a hermes object."""
        start = skip_ws(text, pos + len(NEMOTRON_OPENER))
        if start >= len(text):
            return _invalid() if final else _INCOMPLETE
        if text[start] != "[":
            return _invalid()
        try:
            end = _json_value_end(text, start, NEMOTRON_CLOSER)
            items = None if end is None else json.loads(text[start:end],
                                                        object_pairs_hook=_object_hook)
        except ValueError:
            return _invalid()
        if end is None:
            return _invalid() if final else _INCOMPLETE
        if not items or not all(isinstance(item, dict) for item in items):
            return _invalid()
        calls = [HermesFormat._call_from(item) for item in items]
        failed = next((c for c in calls if isinstance(c, Scan)), None)
        if failed is not None:
            return failed
        after = _expect(text, skip_ws(text, end), NEMOTRON_CLOSER, final)
        if isinstance(after, Scan):
            return after
        problem = next(filter(None, (_identity_problem(c.name, self.tools) for c in calls)),
                       None)
        if problem:
            return _invalid(problem)
        return Scan(COMPLETE, after, calls[0], more=tuple(calls[1:]))


def _has_duplicates(value) -> bool:
    if isinstance(value, dict):
        return getattr(value, "has_duplicates", False) or any(map(_has_duplicates,
                                                                  value.values()))
    return isinstance(value, list) and any(map(_has_duplicates, value))


FORMATS = {"hermes": HermesFormat, "qwen_xml": QwenXmlFormat, "glm_xml": GlmXmlFormat,
           "gemma4": GemmaFormat, "nemotron": NemotronFormat}


def tool_format(name: str, tools: list[ToolSpec]) -> _Format:
    """The parser for an artifact's chat_format.tool_call_format over the offered tools."""
    try:
        cls = FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool call format {name!r}") from None
    return cls({tool.qualified_name: tool for tool in tools})
