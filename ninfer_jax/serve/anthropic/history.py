"""Lowering Anthropic Messages history (system + messages) to conversation Messages.

Rules: consecutive same-role messages join without separators; a mid-conversation system
message keeps its position; one assistant turn renders in the order thinking -> text ->
tool_use; the user turn after an assistant tool-use turn must begin with exactly one
tool_result per tool_use id (matched by id, reordered to call order), and a history may
begin with results. The first top-level system block is dropped when it is the Claude
Code attribution block (text starting with the billing-header prefix). A final text-only
assistant message is a prefill that generation continues. With --vision, image blocks
(source base64 with an image/* media_type, or url) are accepted in user turns and inside
tool_result content, lowered to MediaParts; without it they are refused (vision_disabled).

Block-level cache_control markers are collected per message (a marker counts as a message
boundary only on the message's last block); the request module validates their number.
"""
from __future__ import annotations

import dataclasses
import json

from ninfer_jax.errors import InvalidRequest, Unsupported
from ninfer_jax.serve.core.fields import (
    as_json, check_enum, media_url, opt_bool, require_list, require_object, require_string,
    vision_disabled)
from ninfer_jax.errors import InvalidMedia
from ninfer_jax.text.conversation import MediaPart, Message, ToolCall

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
ROLES = ("user", "assistant", "system")
CACHE_TTLS = ("5m", "1h")
# Blocks that need an executor, a document pipeline or output constraints we lack.
UNSUPPORTED_BLOCKS = {
    "document": "document input", "search_result": "search result blocks",
    "redacted_thinking": "encrypted (redacted) thinking restore",
    "server_tool_use": "server-executed tools", "web_search_tool_result": "server tool results",
    "web_fetch_tool_result": "server tool results", "code_execution_tool_result":
    "server tool results", "mcp_tool_use": "MCP tools", "mcp_tool_result": "MCP tools",
    "container_upload": "container uploads",
}
THINKING, TEXT, TOOL_USE = 0, 1, 2


@dataclasses.dataclass
class CacheMark:
    ttl: str
    message_index: int | None  # the message whose content ends at this block, if any
    param: str


@dataclasses.dataclass
class LoweredMessages:
    messages: list[Message]
    marks: list[CacheMark]  # block-level markers in prompt order
    last_block: tuple[int | None, str] | None  # (message index, param) of the last cacheable block
    is_prefill: bool = False


def cache_control_ttl(value, param: str) -> str | None:
    """The TTL of a cache_control object at `param` (None when absent)."""
    if value is None:
        return None
    value = require_object(value, param)
    check_enum(value.get("type"), f"{param}.type", ("ephemeral",))
    return check_enum(value.get("ttl", "5m"), f"{param}.ttl", CACHE_TTLS)


def cache_ttl(block: dict, param: str) -> str | None:
    return cache_control_ttl(block.get("cache_control"), f"{param}.cache_control")


def _blocks(content, param: str) -> list[tuple[dict, str]]:
    if isinstance(content, str):
        return [({"type": "text", "text": content}, param)]
    blocks = require_list(content, param, expected="a string or an array of content blocks")
    return [(require_object(b, f"{param}[{n}]"), f"{param}[{n}]") for n, b in enumerate(blocks)]


def _check_block_type(block: dict, param: str, vision: bool = False) -> str:
    kind = require_string(block.get("type"), f"{param}.type")  # a list or object is unhashable
    if kind in UNSUPPORTED_BLOCKS:
        raise Unsupported(f"'{kind}' blocks are not supported: this server has no "
                          f"{UNSUPPORTED_BLOCKS[kind]}.", param=f"{param}.type")
    if kind == "image":
        if not vision:
            raise vision_disabled(param)
        return kind
    if kind not in ("text", "thinking", "tool_use", "tool_result"):
        raise Unsupported(f"Content block type {as_json(kind)} is not supported.",
                          param=f"{param}.type")
    return kind


def _image(block: dict, param: str, offset: int) -> MediaPart:
    """An image block's source as a MediaPart: base64 data becomes a data URI."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise InvalidMedia(f"'{param}.source' must be an object.", param=f"{param}.source")
    kind = source.get("type")
    if kind == "base64":
        media_type = source.get("media_type")
        if not isinstance(media_type, str) or not media_type.startswith("image/"):
            raise InvalidMedia(f"'{param}.source.media_type' must be an image/* type.",
                               param=f"{param}.source.media_type")
        data = media_url(source.get("data"), f"{param}.source.data")
        return MediaPart("image", f"data:{media_type};base64,{data}", f"{param}.source.data",
                         offset)
    if kind == "url":
        return MediaPart("image", media_url(source.get("url"), f"{param}.source.url"),
                         f"{param}.source.url", offset)
    if kind == "file":
        raise Unsupported("File sources need the Files API, which this server does not have; "
                          "send the image as base64 or by URL.", param=f"{param}.source.type")
    raise InvalidMedia(f"'{param}.source.type' must be base64 or url; got {as_json(kind)}.",
                       param=f"{param}.source.type")


def _history_error(param: str, message: str, code: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


class _Lowering:
    def __init__(self, vision: bool = False):
        self.out = LoweredMessages([], [], None)
        self.vision = vision

    def _mark(self, block: dict, param: str, index: int | None, *, is_last: bool) -> None:
        ttl = cache_ttl(block, param)
        if ttl is not None:
            self.out.marks.append(CacheMark(ttl, index if is_last else None, param))
        self.out.last_block = (index if is_last else None, param)

    def system(self, value, param: str) -> None:
        blocks = _blocks(value, param)
        if (not isinstance(value, str) and blocks and blocks[0][0].get("type") == "text"
                and isinstance(blocks[0][0].get("text"), str)
                and blocks[0][0]["text"].startswith(BILLING_HEADER_PREFIX)):
            blocks = blocks[1:]  # consumed with its cache_control, never moved elsewhere
        self._plain("system", blocks)

    def _plain(self, role: str, blocks) -> None:
        if not blocks:
            return
        index = len(self.out.messages)
        texts, media = [], []
        for n, (block, param) in enumerate(blocks):
            kind = _check_block_type(block, param, self.vision)
            if kind == "image" and role == "user":
                media.append(_image(block, param, sum(len(t) for t in texts)))
            elif kind != "text":
                raise InvalidRequest(f"{role} content may only hold text blocks here.",
                                     param=f"{param}.type")
            else:
                texts.append(require_string(block.get("text"), f"{param}.text"))
            self._mark(block, param, index, is_last=n == len(blocks) - 1)
        self.out.messages.append(Message(role=role, content="".join(texts), media=media))

    def user(self, blocks) -> None:
        previous = self.out.messages[-1] if self.out.messages else None
        pending_calls = previous.tool_calls if previous and previous.role == "assistant" else []
        leading = []
        while len(leading) < len(blocks) and _check_block_type(*blocks[len(leading)], self.vision) == "tool_result":
            leading.append(blocks[len(leading)])
        rest = blocks[len(leading):]
        for block, param in rest:
            if block["type"] == "tool_result":
                raise _history_error(param, "tool_result blocks must lead their user turn.",
                                     "invalid_tool_history")
        if pending_calls or (leading and previous is not None):
            self._results(pending_calls, leading, rest)
        else:
            self._results_unchecked(leading)
        self._plain("user", rest)
        if not blocks:  # content [] is an empty turn, as content "" is; never dropped
            self.out.messages.append(Message(role="user", content=""))

    def _results(self, calls, leading, rest) -> None:
        param = (leading or rest or [({}, "messages")])[0][1]
        if not calls:
            raise _history_error(f"{param}.tool_use_id", "tool_result does not follow an "
                                 "assistant turn with tool_use blocks.", "invalid_tool_history")
        by_id = {}
        for block, block_param in leading:
            tool_use_id = require_string(block.get("tool_use_id"), f"{block_param}.tool_use_id")
            if tool_use_id in by_id or tool_use_id not in {c.id for c in calls}:
                raise _history_error(f"{block_param}.tool_use_id", f"tool_result '{tool_use_id}' "
                                     "is duplicated or answers no tool_use of the previous "
                                     "assistant turn.", "invalid_tool_history")
            by_id[tool_use_id] = (block, block_param)
        missing = [c.id for c in calls if c.id not in by_id]
        if missing:
            raise _history_error(param, "The user turn after tool use must begin with one "
                                 f"tool_result per tool_use id; missing: {', '.join(missing)}.",
                                 "invalid_tool_history")
        self._results_unchecked([by_id[c.id] for c in calls])

    def _results_unchecked(self, results) -> None:
        seen = set()
        for block, param in results:
            tool_use_id = require_string(block.get("tool_use_id"), f"{param}.tool_use_id")
            if tool_use_id in seen:
                raise _history_error(f"{param}.tool_use_id", f"Duplicate tool_result "
                                     f"'{tool_use_id}'.", "invalid_tool_history")
            seen.add(tool_use_id)
            content = block.get("content", "")
            parts = _blocks(content, f"{param}.content")
            text, media = "", []
            for part, part_param in parts:
                kind = _check_block_type(part, part_param, self.vision)
                if kind == "image":
                    media.append(_image(part, part_param, len(text)))
                    continue
                if kind != "text":
                    raise InvalidRequest("tool_result content holds text (or image) blocks.",
                                         param=f"{part_param}.type")
                text += require_string(part.get("text"), f"{part_param}.text")
            index = len(self.out.messages)
            self.out.messages.append(Message(
                role="tool", content=text, tool_call_id=tool_use_id, media=media,
                is_error=bool(opt_bool(block.get("is_error"), f"{param}.is_error"))))
            self._mark(block, param, index, is_last=True)

    def assistant(self, blocks) -> None:
        index = len(self.out.messages)
        turn, stage = Message(role="assistant"), THINKING
        for n, (block, param) in enumerate(blocks):
            kind = _check_block_type(block, param, self.vision)
            if kind == "image":
                raise Unsupported("Image blocks are supported in user turns and tool results "
                                  "only.", param=f"{param}.type")
            new_stage = {"thinking": THINKING, "text": TEXT, "tool_use": TOOL_USE}.get(kind)
            if new_stage is None:
                raise InvalidRequest("tool_result blocks belong to user turns.",
                                     param=f"{param}.type")
            if new_stage < stage:
                raise _history_error(param, "An assistant turn must be ordered thinking, then "
                                     "text, then tool_use.", "invalid_assistant_history")
            stage = new_stage
            if kind == "thinking":
                text = require_string(block.get("thinking"), f"{param}.thinking")
                turn.reasoning = (turn.reasoning or "") + text
            elif kind == "text":
                turn.content += require_string(block.get("text"), f"{param}.text")
            else:
                call = _tool_call(block, param)
                if any(c.id == call.id for c in turn.tool_calls):
                    # Results are matched by id: a repeated id could never be answered.
                    raise _history_error(f"{param}.id", f"tool_use id '{call.id}' is repeated "
                                         "in this assistant turn.", "invalid_tool_history")
                turn.tool_calls.append(call)
            self._mark(block, param, index, is_last=n == len(blocks) - 1 and kind == "text")
        self.out.messages.append(turn)


def _tool_call(block: dict, param: str) -> ToolCall:
    tool_input = require_object(block.get("input"), f"{param}.input")
    return ToolCall(id=require_string(block.get("id"), f"{param}.id", non_empty=True),
                    name=require_string(block.get("name"), f"{param}.name", non_empty=True),
                    arguments=json.dumps(tool_input, ensure_ascii=False))


def _merged_turns(messages, param: str):
    """(role, [(block, param)]) with consecutive same-role messages joined."""
    turns = []
    for n, message in enumerate(require_list(messages, param, non_empty=True)):
        message = require_object(message, f"{param}[{n}]")
        role = check_enum(message.get("role"), f"{param}[{n}].role", ROLES)
        blocks = _blocks(message.get("content"), f"{param}[{n}].content")
        if turns and turns[-1][0] == role and role != "system":
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    return turns


def lower_messages(system, messages, *, vision: bool = False) -> LoweredMessages:
    lowering = _Lowering(vision)
    if system is not None:
        lowering.system(system, "system")
    turns = _merged_turns(messages, "messages")
    for number, (role, blocks) in enumerate(turns):
        if role == "system":
            lowering._plain("system", blocks)
        elif role == "user":
            lowering.user(blocks)
        else:
            lowering.assistant(blocks)
            is_final = number == len(turns) - 1
            if is_final:
                _check_prefill(blocks)
                lowering.out.is_prefill = True
    return lowering.out


def _check_prefill(blocks) -> None:
    for block, param in blocks:
        if block["type"] != "text":
            raise InvalidRequest("A final assistant message is a prefill and may hold only "
                                 "text (no thinking, tool_use or media).", param=f"{param}.type")
