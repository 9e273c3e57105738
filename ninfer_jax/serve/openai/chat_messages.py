"""OpenAI Chat messages and function tools lowered into the internal Conversation model.

Roles system, developer, user, assistant and tool, plus legacy `function` results and
`function_call` history. Content is a string or ordered text/refusal parts joined without
separators (an empty content stays an empty turn). With --vision, user and tool messages may
hold `image_url` parts and the `video_url` extension (object `{"url", "detail"}` or a plain
URL string; detail omitted or auto), lowered to `MediaPart`s at their text offsets; without
it every media part is refused with `vision_disabled`. Every problem names its field
(`messages[2].tool_calls[0].function.arguments`).
"""
from __future__ import annotations

import json
import secrets

from ninfer_jax.errors import InvalidRequest, Unsupported
from ninfer_jax.serve.core.fields import (as_json, check_image_detail, media_url, opt_bool,
                                          opt_string, require_list, require_object,
                                          require_string, type_name)
from ninfer_jax.text.conversation import MediaPart, Message, ToolCall, ToolSpec

_TEXT_PARTS = ("text", "refusal")
_MEDIA_PARTS = ("image_url", "video_url", "input_image", "input_video")
_CHAT_MEDIA = {"image_url": "image", "video_url": "video"}
_OTHER_INPUT_PARTS = ("input_audio", "file", "audio")
_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


MAX_CACHE_WRITES = 4  # prefix-cache write candidates per request


def _explicit_breakpoint(part: dict, where: str) -> bool:
    marker = part.get("prompt_cache_breakpoint")
    if marker is None:
        return False
    marker = require_object(marker, f"{where}.prompt_cache_breakpoint")
    if marker.get("mode") != "explicit":
        raise InvalidRequest(f"'{where}.prompt_cache_breakpoint.mode' must be 'explicit'.",
                             param=f"{where}.prompt_cache_breakpoint.mode")
    return True


def _content_text(value, param: str, *, allow_media: bool, vision: bool,
                  breakpoints: list | None = None,
                  media: list | None = None) -> str:
    """The content's text; media parts (where allowed) are appended to `media`."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    parts = require_list(value, param, expected="a string or an array of content parts")
    texts: list[str] = []
    for index, part in enumerate(parts):
        where = f"{param}[{index}]"
        part = require_object(part, where)
        if breakpoints is not None and _explicit_breakpoint(part, where):
            breakpoints.append(True)
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            texts.append(require_string(part.get(kind), f"{where}.{kind}"))
        elif kind in _MEDIA_PARTS and allow_media:
            if not vision:
                raise Unsupported(
                    "Image and video input are disabled on this server (start it with "
                    "--vision on a vision-capable model).", param=f"{where}.type",
                    code="vision_disabled")
            if kind not in _CHAT_MEDIA or media is None:
                raise InvalidRequest(f"'{where}.type' must be one of text, refusal, image_url, "
                                     f"video_url; got {as_json(kind)}.", param=f"{where}.type")
            url, url_param = _media_url(part.get(kind), f"{where}.{kind}")
            media.append(MediaPart(_CHAT_MEDIA[kind], url, url_param,
                                   sum(len(t) for t in texts)))
        elif kind in _OTHER_INPUT_PARTS:
            raise Unsupported(f"'{kind}' content is not supported: the model reads text only.",
                              param=f"{where}.type")
        else:
            raise InvalidRequest(f"'{where}.type' must be one of text, refusal; got "
                                 f"{as_json(kind)}.", param=f"{where}.type")
    return "".join(texts)


def _media_url(value, param: str) -> tuple[str, str]:
    """(URL, its field) of `{"url": ..., "detail": ...}` or of the URL string itself (a
    common client shortcut)."""
    if isinstance(value, str):
        return media_url(value, param), param
    value = require_object(value, param)
    check_image_detail(value.get("detail"), f"{param}.detail")
    return media_url(value.get("url"), f"{param}.url"), f"{param}.url"


def _arguments(value, param: str) -> str:
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    text = require_string(value, param)
    try:
        parsed = json.loads(text) if text.strip() else {}
    except ValueError:
        raise InvalidRequest(f"'{param}' must be a JSON object encoded as a string.",
                             param=param) from None
    if not isinstance(parsed, dict):
        raise InvalidRequest(f"'{param}' must encode a JSON object.", param=param)
    return text if text.strip() else "{}"


def _tool_calls(value, param: str) -> list[ToolCall]:
    calls = []
    for index, raw in enumerate(require_list(value, param)):
        where = f"{param}[{index}]"
        raw = require_object(raw, where)
        if raw.get("type", "function") != "function":
            raise Unsupported(f"'{where}.type' must be 'function'.", param=f"{where}.type")
        function = require_object(raw.get("function"), f"{where}.function")
        name = require_string(function.get("name"), f"{where}.function.name", non_empty=True)
        call_id = opt_string(raw.get("id"), f"{where}.id") or f"call_{secrets.token_hex(12)}"
        calls.append(ToolCall(call_id, name,
                              _arguments(function.get("arguments", "{}"),
                                         f"{where}.function.arguments")))
    return calls


def _check_name(message: dict, role: str, param: str) -> None:
    name = message.get("name")
    if name is None:
        return
    if not isinstance(name, str):
        raise InvalidRequest(f"'{param}.name' must be a string.", param=f"{param}.name")
    if name and role not in ("tool", "function"):
        raise Unsupported(f"'{param}.name' names a participant, which the chat template cannot "
                          "represent.", param=f"{param}.name")


def _reasoning(message: dict, param: str) -> str | None:
    values = {key: message.get(key) for key in ("reasoning_content", "reasoning")
              if message.get(key) is not None}
    for key, value in values.items():
        require_string(value, f"{param}.{key}")
    if len(set(values.values())) > 1:
        raise InvalidRequest(f"'{param}.reasoning_content' and '{param}.reasoning' disagree.",
                             param=f"{param}.reasoning")
    return next(iter(values.values()), None)


def parse_messages(value, *, vision: bool = False, implicit_cache: bool = True) -> list[Message]:
    """Messages in order. Prefix-cache hints: explicit `prompt_cache_breakpoint` markers on
    content parts (the latest MAX_CACHE_WRITES) and, unless `implicit_cache` is off, the end
    of the last message. Hints only: they never change the prompt."""
    messages = require_list(value, "messages", non_empty=True)
    out: list[Message] = []
    explicit: list[int] = []
    pending_function_ids: dict[str, list[str]] = {}  # legacy function_call name -> ids
    for index, raw in enumerate(messages):
        param = f"messages[{index}]"
        raw = require_object(raw, param)
        role = raw.get("role")
        if role not in _ROLES:
            shown = repr(role) if isinstance(role, str) else type_name(role)
            raise InvalidRequest(f"'{param}.role' must be one of {', '.join(_ROLES)}; "
                                 f"got {shown}.", param=f"{param}.role")
        _check_name(raw, role, param)
        marks: list = []
        media: list[MediaPart] = []
        content = _content_text(raw.get("content"), f"{param}.content",
                                allow_media=role in ("user", "tool"), vision=vision,
                                breakpoints=marks, media=media)
        if marks:
            explicit.append(index)
        if role == "assistant":
            out.append(_assistant(raw, param, content, pending_function_ids))
        elif role == "tool":
            call_id = require_string(raw.get("tool_call_id"), f"{param}.tool_call_id",
                                     non_empty=True)
            out.append(Message("tool", content, tool_call_id=call_id, media=media))
        elif role == "function":
            name = require_string(raw.get("name"), f"{param}.name", non_empty=True)
            ids = pending_function_ids.get(name) or [f"call_{secrets.token_hex(12)}"]
            out.append(Message("tool", content, tool_call_id=ids.pop(0)))
        else:
            out.append(Message(role, content, media=media))
    for index in explicit[-MAX_CACHE_WRITES:]:
        out[index].cache_breakpoint = True
    if implicit_cache and len(explicit) < MAX_CACHE_WRITES:
        out[-1].cache_breakpoint = True
    return out


def _assistant(raw: dict, param: str, content: str, pending: dict) -> Message:
    calls = []
    if raw.get("tool_calls") is not None:
        calls = _tool_calls(raw["tool_calls"], f"{param}.tool_calls")
    legacy = raw.get("function_call")
    if legacy is not None:
        legacy = require_object(legacy, f"{param}.function_call")
        name = require_string(legacy.get("name"), f"{param}.function_call.name", non_empty=True)
        call = ToolCall(f"call_{secrets.token_hex(12)}", name,
                        _arguments(legacy.get("arguments", "{}"),
                                   f"{param}.function_call.arguments"))
        pending.setdefault(name, []).append(call.id)
        calls.append(call)
    if raw.get("refusal") is not None and not content:
        content = require_string(raw["refusal"], f"{param}.refusal")
    return Message("assistant", content, reasoning=_reasoning(raw, param), tool_calls=calls)


def parse_tools(value) -> list[ToolSpec]:
    if value is None:
        return []
    tools = []
    for index, raw in enumerate(require_list(value, "tools")):
        param = f"tools[{index}]"
        raw = require_object(raw, param)
        if raw.get("type") != "function":
            raise Unsupported(f"'{param}.type' must be 'function': only client-executed "
                              "function tools are supported.", param=f"{param}.type")
        function = require_object(raw.get("function"), f"{param}.function")
        name = require_string(function.get("name"), f"{param}.function.name", non_empty=True)
        if opt_bool(function.get("strict"), f"{param}.function.strict"):
            raise Unsupported("strict tools need constrained decoding, which this server does "
                              "not do.", param=f"{param}.function.strict")
        parameters = function.get("parameters")
        if parameters is not None:
            require_object(parameters, f"{param}.function.parameters")
        description = opt_string(function.get("description"), f"{param}.function.description")
        tools.append(ToolSpec(name, description, parameters))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise InvalidRequest("Tool names must be unique.", param="tools")
    return tools
