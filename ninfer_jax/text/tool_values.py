"""Typing of Qwen XML tool-parameter text by the offered tool's JSON schema.

The Qwen XML call format writes every parameter value as bare text. The declared schema of
the parameter guides how that text becomes a JSON value:

- the schema's direct `type` (a name or a list of names), or an anyOf/oneOf whose members are
  all plain primitive `type`s, gives the admitted types;
- when a string is admitted the text stays a string, the empty string included;
- an empty value of a declared non-string parameter is omitted from the arguments;
- otherwise the text is read as JSON (booleans also case-insensitively); a value whose JSON
  type is admitted keeps it; a mismatch stays structured: valid JSON keeps the type it
  represents, other text becomes a JSON string, so the tool consumer can report the error;
- a schema without a supported explicit type falls back to untyped inference (JSON when the
  text parses as JSON, else a string).

No defaults, required properties or recursive validation: that is the tool consumer's job.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

PRIMITIVE_TYPES = frozenset({"string", "integer", "number", "boolean", "null", "object", "array"})
OMIT = object()  # marker: the parameter is left out of the arguments


@dataclasses.dataclass(frozen=True)
class TypedValue:
    value: Any  # a JSON-ready Python value, or OMIT
    schema_mismatch: bool = False


def admitted_types(schema: Any) -> frozenset[str] | None:
    """The explicit primitive types a parameter schema admits, or None (untyped)."""
    if not isinstance(schema, dict):
        return None
    declared = schema.get("type")
    if isinstance(declared, str):
        return frozenset([declared]) if declared in PRIMITIVE_TYPES else None
    if isinstance(declared, list) and declared:
        if all(isinstance(t, str) and t in PRIMITIVE_TYPES for t in declared):
            return frozenset(declared)
        return None
    for combinator in ("anyOf", "oneOf"):
        members = schema.get(combinator)
        if isinstance(members, list) and members:
            names = [m.get("type") if isinstance(m, dict) and len(m) == 1 else None
                     for m in members]
            if all(isinstance(n, str) and n in PRIMITIVE_TYPES for n in names):
                return frozenset(names)
            return None
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")  # NaN/Infinity would not serialize back as JSON


def _parse_json(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text, object_pairs_hook=dict, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return False, None


def type_parameter(text: str, schema: Any) -> TypedValue:
    types = admitted_types(schema)
    if types is None:
        ok, value = _parse_json(text.strip()) if text.strip() else (False, None)
        return TypedValue(value if ok else text)
    if "string" in types:
        return TypedValue(text)
    stripped = text.strip()
    if not stripped:
        return TypedValue(OMIT)
    if "boolean" in types and stripped.lower() in ("true", "false"):
        return TypedValue(stripped.lower() == "true")
    ok, value = _parse_json(stripped)
    if ok:
        kind = _json_type(value)
        if kind in types or (kind == "integer" and "number" in types):
            return TypedValue(value)
        return TypedValue(value, schema_mismatch=True)
    return TypedValue(text, schema_mismatch=True)
