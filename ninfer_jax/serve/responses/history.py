"""Lowering a canonical Responses Item history to conversation Messages.

Contiguous assistant-owned Items (reasoning, assistant messages, function calls) form one
assistant turn in the only order a chat template can render: reasoning, then content, then
calls; any other order is `invalid_assistant_history`. A run of function_call_output Items
must answer exactly the calls of the assistant turn right before it (matched by call_id,
reordered to call order), and a turn with calls must be followed by those results before
any other message; otherwise `invalid_tool_history`. A history may begin with results (a
truncated or imported conversation) and end at calls not yet answered.

Cache-write candidates (OpenAI prompt caching) are computed here too, because they depend
on where each Item's content ends in the lowered messages.
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.errors import InvalidRequest
from ninfer_jax.text.conversation import MediaPart, Message, ToolCall

MAX_CACHE_WRITES = 4
# Turn stages: the order in which assistant-owned Items may appear inside one turn.
REASONING, CONTENT, CALLS = 0, 1, 2


def _history_error(param: str, message: str, code: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def _part_text(part: dict) -> str:
    return part["refusal"] if part["type"] == "refusal" else part.get("text", "")


_MEDIA = {"input_image": ("image", "image_url"), "input_video": ("video", "video_url")}


def _parts_media(parts, param: str) -> list[MediaPart]:
    """The media parts of a normalized part list, at their offsets in its joined text."""
    media, offset = [], 0
    for n, part in enumerate(parts if not isinstance(parts, str) else ()):
        if part["type"] in _MEDIA:
            kind, field = _MEDIA[part["type"]]
            media.append(MediaPart(kind, part[field], f"{param}[{n}].{field}", offset))
        else:
            offset += len(_part_text(part))
    return media


def _ends_with_breakpoint(parts) -> bool:
    return bool(parts) and not isinstance(parts, str) and "prompt_cache_breakpoint" in parts[-1]


@dataclasses.dataclass
class LoweredHistory:
    messages: list[Message]
    explicit_marks: list[int]  # message indices whose content ends at an explicit marker
    cacheable: list[int]  # message indices holding client content (implicit candidates)

    def apply_cache_breakpoints(self, *, implicit: bool) -> None:
        """Mark at most four write candidates: the latest explicit markers first, then the
        automatic candidate at the latest cacheable content when a slot is left."""
        chosen = sorted(set(self.explicit_marks))[-MAX_CACHE_WRITES:]
        if implicit and len(chosen) < MAX_CACHE_WRITES and self.cacheable:
            chosen.append(self.cacheable[-1])
        for index in chosen:
            self.messages[index].cache_breakpoint = True


class _Lowering:
    def __init__(self):
        self.history = LoweredHistory([], [], [])
        self.turn: Message | None = None
        self.turn_stage = REASONING
        self.turn_marked = False
        self.results: list[tuple[dict, str]] = []

    def feed(self, item: dict, param: str) -> None:
        kind = item["type"]
        if kind == "function_call_output":
            self._flush_turn()
            self.results.append((item, param))
            return
        self._flush_results()
        if kind == "message" and item["role"] != "assistant":
            self._flush_turn()
            self._check_answered(param)
            text = "".join(_part_text(p) for p in item["content"])
            media = _parts_media(item["content"], f"{param}.content")
            self._append(Message(role=item["role"], content=text, media=media),
                         marked=_ends_with_breakpoint(item["content"]), cacheable=True)
        else:
            self._add_to_turn(item, param)

    def _check_answered(self, param: str) -> None:
        """A turn's calls are answered before the conversation moves on (as at OpenAI: "no
        tool output found"); a history may still end at calls the client has yet to run."""
        messages = self.history.messages
        if messages and messages[-1].role == "assistant" and messages[-1].tool_calls:
            missing = ", ".join(call.id for call in messages[-1].tool_calls)
            raise _history_error(param, "This item follows function calls without their "
                                 f"function_call_output items (call_id(s): {missing}).",
                                 "invalid_tool_history")

    def finish(self) -> LoweredHistory:
        self._flush_turn()
        self._flush_results()
        return self.history

    def _append(self, message: Message, *, marked: bool, cacheable: bool) -> None:
        index = len(self.history.messages)
        self.history.messages.append(message)
        if marked:
            self.history.explicit_marks.append(index)
        if cacheable:
            self.history.cacheable.append(index)

    def _add_to_turn(self, item: dict, param: str) -> None:
        stage = {"reasoning": REASONING, "message": CONTENT, "function_call": CALLS}[item["type"]]
        if self.turn is None:
            self.turn, self.turn_stage, self.turn_marked = Message(role="assistant"), stage, False
        elif stage < self.turn_stage:
            raise _history_error(
                param, f"This {item['type']} item follows later parts of the same assistant "
                "turn; one turn must be ordered reasoning, then message content, then "
                "function calls.", "invalid_assistant_history")
        self.turn_stage = stage
        if stage == REASONING:
            text = "".join(p["text"] for p in item["content"])
            self.turn.reasoning = (self.turn.reasoning or "") + text
        elif stage == CONTENT:
            self.turn.content += "".join(_part_text(p) for p in item["content"])
            self.turn_marked = _ends_with_breakpoint(item["content"])
        else:
            self.turn.tool_calls.append(ToolCall(id=item["call_id"], name=item["name"],
                                                 arguments=item["arguments"],
                                                 namespace=item.get("namespace")))

    def _flush_turn(self) -> None:
        if self.turn is not None:
            marked = self.turn_marked and not self.turn.tool_calls
            self._append(self.turn, marked=marked, cacheable=False)
            self.turn = None

    def _flush_results(self) -> None:
        if not self.results:
            return
        results, self.results = self.results, []
        messages = self.history.messages
        if not messages:  # a truncated or imported history may start with results
            ordered = results
            _check_unique(results)
        else:
            previous = messages[-1]
            if previous.role != "assistant" or not previous.tool_calls:
                item, param = results[0]
                raise _history_error(
                    f"{param}.call_id", f"function_call_output '{item['call_id']}' does not "
                    "follow an assistant turn with function calls.", "invalid_tool_history")
            ordered = _match_results(previous.tool_calls, results)
        for item, param in ordered:
            output = item["output"]
            content = output if isinstance(output, str) else "".join(
                _part_text(p) for p in output)
            self._append(Message(role="tool", content=content, tool_call_id=item["call_id"],
                                 media=_parts_media(output, f"{param}.output")),
                         marked=_ends_with_breakpoint(output), cacheable=True)


def _check_unique(results) -> None:
    seen = set()
    for item, param in results:
        if item["call_id"] in seen:
            raise _history_error(f"{param}.call_id", f"Duplicate function_call_output for "
                                 f"call_id '{item['call_id']}'.", "invalid_tool_history")
        seen.add(item["call_id"])


def _match_results(calls: list[ToolCall], results) -> list[tuple[dict, str]]:
    """Results validated against `calls` and reordered to call declaration order."""
    _check_unique(results)
    by_id = {call.id: call for call in calls}
    for item, param in results:
        call = by_id.get(item["call_id"])
        if call is None:
            raise _history_error(f"{param}.call_id", f"function_call_output names unknown "
                                 f"call_id '{item['call_id']}'.", "invalid_tool_history")
        for key, expected in (("name", call.name), ("namespace", call.namespace)):
            if key in item and item[key] != expected:
                raise _history_error(f"{param}.{key}", f"function_call_output {key} "
                                     f"'{item[key]}' does not match call '{call.id}' "
                                     f"({key} {expected!r}).", "invalid_tool_history")
    answered = {item["call_id"] for item, _ in results}
    missing = [call.id for call in calls if call.id not in answered]
    if missing:
        item, param = results[-1]
        raise _history_error(f"{param}.call_id", "Tool results must answer every call of the "
                             f"assistant turn; missing call_id(s): {', '.join(missing)}.",
                             "invalid_tool_history")
    position = {call.id: n for n, call in enumerate(calls)}
    return sorted(results, key=lambda pair: position[pair[0]["call_id"]])


def lower_items(items_with_params) -> LoweredHistory:
    """Lower (item, param) pairs, in history order, to messages plus cache candidates."""
    lowering = _Lowering()
    for item, param in items_with_params:
        lowering.feed(item, param)
    return lowering.finish()
