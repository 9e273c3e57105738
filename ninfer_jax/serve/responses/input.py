"""Responses input Items: validation, normalization and lowering to a Conversation.

`normalize_input(value, vision=...)` turns the wire `input` (a string or an Item array) into canonical
Item dicts (ids generated where absent, string content expanded to parts) in client
order; these are what GET input_items lists and what the store chains for continuation.
`lower_items(items)` turns a whole Item history (stored context + new input) into
`text.conversation.Message`s: contiguous assistant-owned Items become one assistant turn
(reasoning -> content -> calls), tool results are checked against the calls they answer
and reordered to call order. Media: `input_image` (`image_url` an http(s) URL or a data URI;
detail omitted or auto) and the `input_video` extension (`video_url`) in user messages and
function_call_output arrays, with --vision; without it they are refused (vision_disabled).
"""
from __future__ import annotations

import json

from ninfer_jax.errors import InvalidRequest, Unsupported
from ninfer_jax.serve.core.fields import (
    as_json, check_enum, check_image_detail, invalid, media_url, new_id, opt_string,
    require_list, require_object, require_string, vision_disabled)
from ninfer_jax.text.conversation import Message, ToolCall

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
ID_PREFIX = {"message": "msg", "reasoning": "rs", "function_call": "fc",
             "function_call_output": "fco"}
MEDIA_PARTS = {"input_image": "image_url", "input_video": "video_url"}  # type -> URL field
UNSUPPORTED_PARTS = ("input_file", "input_audio")


# ----------------------------------------------------------------------------- normalize


def normalize_input(value, *, param: str = "input", vision: bool = False) -> list[dict]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "id": new_id("msg"), "role": "user", "status": "completed",
                 "content": [{"type": "input_text", "text": value}]}]
    value = require_list(value, param, expected="a string or an array of input items")
    items = [_normalize_item(item, f"{param}[{n}]", vision) for n, item in enumerate(value)]
    seen = set()
    for n, item in enumerate(items):
        if item["id"] in seen:
            raise InvalidRequest(f"Duplicate input item id '{item['id']}'.",
                                 param=f"{param}[{n}].id")
        seen.add(item["id"])
    return items


def _normalize_item(item, param: str, vision: bool) -> dict:
    item = require_object(item, param)
    kind = item.get("type", "message" if "role" in item else None)
    normalizer = {"message": _normalize_message, "reasoning": _normalize_reasoning,
                  "function_call": _normalize_call,
                  "function_call_output": _normalize_call_output}.get(
                      kind if isinstance(kind, str) else None)
    if normalizer is None:
        raise Unsupported(f"Input item type {as_json(kind)} is not supported; supported types are "
                          "message, reasoning, function_call and function_call_output.",
                          param=f"{param}.type")
    normalized = (normalizer(item, param, vision) if kind in ("message", "function_call_output")
                  else normalizer(item, param))
    item_id = opt_string(item.get("id"), f"{param}.id")
    normalized["id"] = item_id or new_id(ID_PREFIX[kind])
    return {"id": normalized.pop("id"), **normalized}


def _normalize_message(item: dict, param: str, vision: bool) -> dict:
    role = check_enum(item.get("role"), f"{param}.role", MESSAGE_ROLES)
    content = item.get("content")
    if isinstance(content, str):
        part_type = "output_text" if role == "assistant" else "input_text"
        parts = [_text_part(part_type, content)]
    else:
        content = require_list(content, f"{param}.content",
                               expected="a string or an array of content parts")
        parts = [_normalize_part(part, role, f"{param}.content[{n}]", vision)
                 for n, part in enumerate(content)]
    status = opt_string(item.get("status"), f"{param}.status") or "completed"
    opt_string(item.get("phase"), f"{param}.phase")  # accepted; no prompt representation
    return {"type": "message", "role": role, "status": status, "content": parts}


def _text_part(part_type: str, text: str) -> dict:
    part = {"type": part_type, "text": text}
    if part_type == "output_text":
        part["annotations"] = []
    return part


def _normalize_part(part, role: str, param: str, vision: bool) -> dict:
    part = require_object(part, param)
    kind = require_string(part.get("type"), f"{param}.type")
    if kind in ("input_text", "output_text"):
        if kind == "output_text" and role != "assistant":
            raise InvalidRequest(f"'output_text' parts belong to assistant messages, not "
                                 f"'{role}'.", param=f"{param}.type")
        normalized = _text_part(kind, require_string(part.get("text"), f"{param}.text"))
    elif kind == "refusal":
        if role != "assistant":
            raise InvalidRequest("'refusal' parts belong to assistant messages.",
                                 param=f"{param}.type")
        normalized = {"type": "refusal",
                      "refusal": require_string(part.get("refusal"), f"{param}.refusal")}
    elif kind in MEDIA_PARTS:
        normalized = _media_part(part, kind, role, param, vision)
    elif kind in UNSUPPORTED_PARTS:
        raise Unsupported(f"'{kind}' content is not supported by this server.",
                          param=f"{param}.type")
    else:
        raise Unsupported(f"Content part type {as_json(kind)} is not supported.",
                          param=f"{param}.type")
    breakpoint_ = _cache_breakpoint(part, param)
    if breakpoint_ is not None:
        normalized["prompt_cache_breakpoint"] = breakpoint_
    return normalized


def _media_part(part: dict, kind: str, role: str, param: str, vision: bool) -> dict:
    if not vision:
        raise vision_disabled(param)
    if role not in ("user", "tool"):
        raise Unsupported(f"'{kind}' parts are supported in user messages and tool outputs "
                          f"only, not in '{role}' messages.", param=f"{param}.type")
    if part.get("file_id") is not None:
        raise Unsupported("File ids are not supported: send the media by URL or data URI.",
                          param=f"{param}.file_id")
    url_field = MEDIA_PARTS[kind]
    normalized = {"type": kind, url_field: media_url(part.get(url_field), f"{param}.{url_field}")}
    if kind == "input_image":
        check_image_detail(part.get("detail"), f"{param}.detail")
        normalized["detail"] = "auto"
    return normalized


def _cache_breakpoint(part: dict, param: str) -> dict | None:
    value = part.get("prompt_cache_breakpoint")
    if value is None:
        return None
    value = require_object(value, f"{param}.prompt_cache_breakpoint")
    check_enum(value.get("mode"), f"{param}.prompt_cache_breakpoint.mode", ("explicit",))
    return {"mode": "explicit"}


def _normalize_reasoning(item: dict, param: str) -> dict:
    content = item.get("content")
    texts = []
    for n, part in enumerate(require_list(content, f"{param}.content") if content else []):
        part = require_object(part, f"{param}.content[{n}]")
        check_enum(part.get("type"), f"{param}.content[{n}].type", ("reasoning_text",))
        texts.append(require_string(part.get("text"), f"{param}.content[{n}].text"))
    if not texts:
        raise Unsupported("A reasoning item needs its raw reasoning_text content; summaries "
                          "or encrypted content cannot restore the reasoning.",
                          param=f"{param}.content")
    summary = require_list(item.get("summary", []) or [], f"{param}.summary")
    normalized = {"type": "reasoning", "summary": summary,
                  "content": [{"type": "reasoning_text", "text": t} for t in texts]}
    if item.get("encrypted_content") is not None:
        normalized["encrypted_content"] = require_string(item["encrypted_content"],
                                                         f"{param}.encrypted_content")
    return normalized


def _check_completed(item: dict, param: str) -> None:
    status = item.get("status")
    if status not in (None, "completed"):
        raise Unsupported(f"Partial tool items (status {as_json(status)}) are not supported.",
                          param=f"{param}.status")


def _normalize_call(item: dict, param: str) -> dict:
    _check_completed(item, param)
    arguments = require_string(item.get("arguments"), f"{param}.arguments")
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise invalid(f"{param}.arguments", "a JSON object encoded as a string", arguments)
    normalized = {"type": "function_call",
                  "call_id": require_string(item.get("call_id"), f"{param}.call_id", non_empty=True),
                  "name": require_string(item.get("name"), f"{param}.name", non_empty=True),
                  "arguments": arguments, "status": "completed"}
    namespace = opt_string(item.get("namespace"), f"{param}.namespace")
    if namespace:
        normalized["namespace"] = namespace
    return normalized


def _normalize_call_output(item: dict, param: str, vision: bool) -> dict:
    _check_completed(item, param)
    output = item.get("output")
    if not isinstance(output, str):
        parts = require_list(output, f"{param}.output", non_empty=True)
        output = [_normalize_part(part, "tool", f"{param}.output[{n}]", vision)
                  for n, part in enumerate(parts)]
    normalized = {"type": "function_call_output",
                  "call_id": require_string(item.get("call_id"), f"{param}.call_id", non_empty=True),
                  "output": output, "status": "completed"}
    for key in ("name", "namespace"):
        value = opt_string(item.get(key), f"{param}.{key}")
        if value:
            normalized[key] = value
    return normalized
