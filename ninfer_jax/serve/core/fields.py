"""Typed field readers shared by the wire adapters (Chat and Completions, Responses, Anthropic).

Every reader takes the raw JSON value and its dotted parameter path, and raises
`InvalidRequest(param=path)` for a malformed value, so each 400 names the exact field.
JSON booleans are never accepted as numbers. A client value quoted back in a message is
written as JSON (`as_json`: null, true, "text"), the notation the client sent. Also owns
the merge of chat_template_kwargs with the typed thinking options, which Responses and
Anthropic share.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import secrets
from typing import Any

from ninfer_jax.errors import InvalidMedia, InvalidRequest, Unsupported

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
PRIORITY_CLASSES = ("foreground", "background")
# Template options with a typed request field; a kwargs value must agree with it.
STANDARD_TEMPLATE_OPTIONS = ("enable_thinking", "preserve_thinking", "reasoning_effort")
# Prompt structure the request fields own; kwargs may not override it.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
    "bos_token", "eos_token", "pad_token", "unk_token",
})


# A function tool's name, in every dialect.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def vision_disabled(param: str) -> InvalidRequest:
    return InvalidRequest("Image and video input need a server started with --vision; this "
                          "server has no vision component loaded.", param=param,
                          code="vision_disabled")


def media_url(value, param: str) -> str:
    """A media source URL (data URI or http(s); serve/media/sources.py checks which): a
    missing or non-string source is already invalid_media."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidMedia(f"'{param}' must be a non-empty URL string (http(s) or a data "
                           f"URI), got {type_name(value)}.", param=param)
    return value


def check_image_detail(value, param: str) -> None:
    """OpenAI image `detail`: omitted or auto; low/high promise a resolution we do not pick."""
    if value in ("low", "high"):
        raise Unsupported(f"'{param}' {as_json(value)} is not supported: images are read at "
                          "the resolution the model's processor picks (omit it or use 'auto').",
                          param=param)
    if value not in (None, "auto"):
        raise InvalidRequest(f"'{param}' must be 'auto' when given.", param=param)


log = logging.getLogger("ninfer_jax.serve")
MAX_WARNED_FIELDS = 10


def warn_unknown(body: dict, known: frozenset, request_id: str) -> None:
    """Unknown top-level fields are ignored (serving.md), as vLLM does: the reply is
    unchanged and the operator's log names what was ignored (at most MAX_WARNED_FIELDS names,
    each quoted and cut, since they are the client's text)."""
    unknown = [key for key in body if key not in known]
    if unknown:
        shown = ", ".join(as_json(key, 40) for key in unknown[:MAX_WARNED_FIELDS])
        more = len(unknown) - MAX_WARNED_FIELDS
        log.warning("request %s: ignored unknown top-level fields %s%s", request_id, shown,
                    f" and {more} more" if more > 0 else "")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def type_name(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def as_json(value, limit: int = 60) -> str:
    """A client's value as it appears in its JSON, cut to `limit` characters (a message
    never echoes a whole object back)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return type_name(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def invalid(param: str, expected: str, value) -> InvalidRequest:
    return InvalidRequest(f"'{param}' must be {expected}, got {type_name(value)}.", param=param)


def require_object(value, param: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(param, "an object", value)
    return value


def require_list(value, param: str, *, non_empty: bool = False,
                 expected: str = "an array") -> list:
    """`expected` names what the field may be where a string was already accepted (e.g. "a
    string or an array of content parts")."""
    if not isinstance(value, list):
        raise invalid(param, expected, value)
    if non_empty and not value:
        raise InvalidRequest(f"'{param}' must not be empty.", param=param)
    return value


def require_string(value, param: str, *, non_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise invalid(param, "a string", value)
    if non_empty and not value:
        raise InvalidRequest(f"'{param}' must be a non-empty string.", param=param)
    return value


def opt_string(value, param: str) -> str | None:
    return None if value is None else require_string(value, param)


def opt_bool(value, param: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise invalid(param, "a boolean", value)


def opt_number(value, param: str, low: float, high: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise invalid(param, "a finite number", value)
    # Compared before any float(): a JSON integer is unbounded, and one past a float's range
    # would raise OverflowError there.
    if not low <= value <= high:
        shown = value if isinstance(value, float) or abs(value) < 10**18 else (
            f"an integer of {len(str(abs(value)))} digits")
        raise InvalidRequest(f"'{param}' must be in [{low}, {high}], got {shown}.", param=param)
    return float(value)


def integral(value) -> int | None:
    """The integer a JSON value stands for, or None: an integer, or a float with no fraction
    (5.0, which JavaScript clients and pydantic's lax mode send for 5, as vLLM and OpenAI
    accept). Booleans, strings and 5.5 stand for none. Every integer-valued request field
    of every dialect is read through here, so one value means the same everywhere."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def require_int(value, param: str, low: int | None = None, high: int | None = None,
                where: str | None = None) -> int:
    """An integer in [low, high]; else a 400 on `param` (`where` names the element the
    message quotes, e.g. stop_token_ids[2], when it is not the field itself)."""
    where = where or param
    number = integral(value)
    if number is None:
        got = as_json(value) if isinstance(value, (float, str)) else type_name(value)
        raise InvalidRequest(f"'{where}' must be an integer, got {got}.", param=param)
    if (low is not None and number < low) or (high is not None and number > high):
        bounds = (f">= {low}" if high is None else f"<= {high}" if low is None
                  else f"in [{low}, {high}]")
        shown = number if abs(number) < 10**30 else f"an integer of {len(str(abs(number)))} digits"
        raise InvalidRequest(f"'{where}' must be {bounds}, got {shown}.", param=param)
    return number


_INTEGER_TEXT = re.compile(r"-?[0-9]+")


def integer_key(key: str, param: str) -> int:
    """An object key that stands for an integer (logit_bias's token ids: JSON keys are
    text), written as plain decimal digits ("5"; not "5.0", "+5" or " 5")."""
    if not _INTEGER_TEXT.fullmatch(key):
        raise InvalidRequest(f"'{param}' keys must be integers written as text, got "
                             f"{as_json(key)}.", param=param)
    return int(key)


def opt_int(value, param: str, low: int | None = None, high: int | None = None) -> int | None:
    return None if value is None else require_int(value, param, low, high)


def opt_top_k(value, param: str, high: int) -> int | None:
    """A top_k of at most `high`; zero or below means "no top-k filter" (tensorfold-
    serving.md; vLLM and the OpenAI-compatible servers send -1) and is normalised to 0, so
    a disabled request still overrides a model preset's top_k (the engine reads any
    top_k <= 0 as disabled: engine.request.SamplingParams)."""
    top_k = opt_int(value, param, None, high)
    return None if top_k is None else max(0, top_k)


def check_enum(value, param: str, allowed) -> Any:
    if value not in allowed:
        raise InvalidRequest(
            f"'{param}' must be one of {', '.join(map(str, allowed))}; got {as_json(value)}.",
            param=param)
    return value


def is_background(value, param: str = "priority") -> bool:
    """The request `priority` of every dialect: TensorFold's "background" | "foreground", or
    vLLM's integer where lower runs earlier and 0 is the default, so > 0 is background and
    <= 0 foreground. Absent (or null) is foreground."""
    if value is None:
        return False
    if value in PRIORITY_CLASSES:
        return value == "background"
    number = integral(value)
    if number is None:
        shown = as_json(value) if isinstance(value, (str, float)) else type_name(value)
        raise InvalidRequest(f"'{param}' must be 'background', 'foreground' or an integer "
                             f"(> 0: background); got {shown}.", param=param)
    return number > 0


def allows_draft(value, param: str = "draft") -> bool:
    """TensorFold's per-request `draft` of every dialect: false decodes this request without
    speculation (the serial reference); true or absent lets the server's --spec work."""
    return opt_bool(value, param) is not False


@dataclasses.dataclass(frozen=True)
class TemplateOptions:
    """Thinking options after merging typed fields with chat_template_kwargs."""

    enable_thinking: bool | None
    preserve_thinking: bool | None
    reasoning_effort: str | None  # as requested ("none" included)
    extra_kwargs: dict

    @property
    def template_effort(self) -> str | None:
        """What the template sees: 'none' is expressed as enable_thinking=False instead."""
        return None if self.reasoning_effort == "none" else self.reasoning_effort


def conflicting(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="conflicting_template_option")


def merge_template_options(kwargs, typed: dict, *, param: str = "chat_template_kwargs",
                           typed_params: dict | None = None) -> TemplateOptions:
    """Merge `kwargs` (the client's chat_template_kwargs) with typed option values.

    `typed` maps standard option names to the typed fields' values (None = unspecified);
    `typed_params` names those fields for error messages. A null standard kwarg means
    unspecified; other null kwargs stay null for the template."""
    kwargs = {} if kwargs is None else require_object(kwargs, param)
    typed_params = typed_params or {}
    for key in kwargs:
        if key in RESERVED_TEMPLATE_KWARGS:
            raise InvalidRequest(f"'{param}.{key}' cannot be set through template kwargs; "
                                 "the request's own fields control it.", param=f"{param}.{key}")
    resolved = {}
    for name in STANDARD_TEMPLATE_OPTIONS:
        from_kwargs, from_field = kwargs.get(name), typed.get(name)
        if from_kwargs is not None and from_field is not None and from_kwargs != from_field:
            field = typed_params.get(name, name)
            raise conflicting(f"{param}.{name}", f"'{param}.{name}' ({as_json(from_kwargs)}) "
                              f"disagrees with '{field}' ({as_json(from_field)}).")
        resolved[name] = from_field if from_field is not None else from_kwargs
    opt_bool(resolved["enable_thinking"], f"{param}.enable_thinking")
    opt_bool(resolved["preserve_thinking"], f"{param}.preserve_thinking")
    effort = resolved["reasoning_effort"]
    if effort is not None:
        check_enum(effort, typed_params.get("reasoning_effort", f"{param}.reasoning_effort"),
                   REASONING_EFFORTS)
    enable = resolved["enable_thinking"]
    if effort is not None and enable is not None and (effort == "none") == enable:
        raise conflicting(f"{param}.enable_thinking",
                          f"enable_thinking={as_json(enable)} contradicts reasoning effort "
                          f"{as_json(effort)}.")
    if effort == "none":
        enable = False
    extra = {k: v for k, v in kwargs.items() if k not in STANDARD_TEMPLATE_OPTIONS}
    return TemplateOptions(enable, resolved["preserve_thinking"], effort, extra)
