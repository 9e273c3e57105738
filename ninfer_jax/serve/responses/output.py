"""Building Response objects and their semantic SSE events from dialect-neutral output.

`ResponseBuilder` is fed the pieces of one reply in order (reasoning text, answer text,
completed tool calls, then the terminal status) and keeps both the typed output Items and
the stream of events describing them. The aggregate endpoint reads only the final object;
the streaming endpoint sends every event. One builder guarantees the SSE lifecycle
(created, in_progress, item added/part added, deltas, *.done, one terminal event), stable
item ids and indices, and a strictly increasing sequence_number, and that concatenated
deltas equal the terminal Items.
"""
from __future__ import annotations

import copy
import time

from ninfer_jax.serve.core.fields import new_id

REASONING_ITEM, MESSAGE_ITEM = "reasoning", "message"
TERMINAL_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete",
                   "cancelled": "response.incomplete", "failed": "response.failed"}


def usage_object(prompt_tokens: int, cached_tokens: int, output_tokens: int,
                 reasoning_tokens: int) -> dict:
    return {"input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt_tokens + output_tokens}


class ResponseBuilder:
    def __init__(self, envelope: dict):
        self.response = envelope  # id, model and echoed request fields; status in_progress
        self.response.update(status="in_progress", output=[], usage=None, error=None,
                             incomplete_details=None, completed_at=None)
        self.events: list[dict] = []
        self._sequence = 0
        self._open: dict | None = None  # the output Item receiving deltas

    # -- event plumbing
    def _emit(self, event_type: str, **payload) -> None:
        self.events.append({"type": event_type, "sequence_number": self._sequence, **payload})
        self._sequence += 1

    def take_events(self) -> list[dict]:
        events, self.events = self.events, []
        return events

    def _snapshot(self) -> dict:
        return copy.deepcopy(self.response)

    def start(self) -> None:
        self._emit("response.created", response=self._snapshot())
        self._emit("response.in_progress", response=self._snapshot())

    # -- output pieces
    def reasoning(self, text: str) -> None:
        if text:
            self._delta(REASONING_ITEM, text)

    def content(self, text: str) -> None:
        if text:
            self._delta(MESSAGE_ITEM, text)

    def tool_call(self, name: str, arguments: str, namespace: str | None = None) -> None:
        self._close_open("completed")
        item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress",
                "call_id": new_id("call"), "name": name, "arguments": ""}
        if namespace:
            item["namespace"] = namespace
        index = self._add_item(item)
        self._emit("response.function_call_arguments.delta", item_id=item["id"],
                   output_index=index, delta=arguments)
        item["arguments"] = arguments
        self._emit("response.function_call_arguments.done", item_id=item["id"],
                   output_index=index, arguments=arguments)
        item["status"] = "completed"
        self._emit("response.output_item.done", output_index=index, item=copy.deepcopy(item))

    def _add_item(self, item: dict) -> int:
        index = len(self.response["output"])
        self.response["output"].append(item)
        self._emit("response.output_item.added", output_index=index, item=copy.deepcopy(item))
        return index

    def _delta(self, kind: str, text: str) -> None:
        if self._open is None or self._open["type"] != kind:
            self._close_open("completed")
            self._open_item(kind)
        item = self._open
        part = item["content"][0]
        part["text"] += text
        event = ("response.reasoning_text.delta" if kind == REASONING_ITEM
                 else "response.output_text.delta")
        extra = {} if kind == REASONING_ITEM else {"logprobs": []}
        self._emit(event, item_id=item["id"], output_index=self._open_index, content_index=0,
                   delta=text, **extra)

    def _open_item(self, kind: str) -> None:
        if kind == REASONING_ITEM:
            item = {"id": new_id("rs"), "type": "reasoning", "status": "in_progress",
                    "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": new_id("msg"), "type": "message", "status": "in_progress",
                    "role": "assistant", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self._open_index = self._add_item(item)
        self._open = item
        item["content"].append(part)
        self._emit("response.content_part.added", item_id=item["id"],
                   output_index=self._open_index, content_index=0, part=copy.deepcopy(part))

    def _close_open(self, status: str) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        index, part = self._open_index, item["content"][0]
        done = ("response.reasoning_text.done" if item["type"] == REASONING_ITEM
                else "response.output_text.done")
        extra = {} if item["type"] == REASONING_ITEM else {"logprobs": []}
        self._emit(done, item_id=item["id"], output_index=index, content_index=0,
                   text=part["text"], **extra)
        self._emit("response.content_part.done", item_id=item["id"], output_index=index,
                   content_index=0, part=copy.deepcopy(part))
        item["status"] = status
        self._emit("response.output_item.done", output_index=index, item=copy.deepcopy(item))

    # -- terminal
    def finish(self, status: str, usage: dict, *, incomplete_reason: str | None = None,
               emit_terminal: bool = True) -> dict:
        """Close the open Item and set the terminal state; returns the final object.

        With emit_terminal=False the caller sends the terminal event later (after storing
        the Response), or `fail()` replaces it."""
        self._close_open("completed" if status == "completed" else "incomplete")
        self.response["status"] = status
        self.response["usage"] = usage
        if status == "completed":
            self.response["completed_at"] = int(time.time())
        if incomplete_reason:
            self.response["incomplete_details"] = {"reason": incomplete_reason}
        if emit_terminal:
            self.emit_terminal()
        return self.response

    def emit_terminal(self) -> None:
        self._emit(TERMINAL_EVENTS[self.response["status"]], response=self._snapshot())

    def fail(self, error: dict, usage: dict | None = None) -> dict:
        """An error after the stream started: response.failed carries the error object."""
        self._close_open("incomplete")
        self.response.update(status="failed", error=error, completed_at=None,
                             usage=usage if usage is not None else self.response["usage"])
        self._emit("response.failed", response=self._snapshot())
        return self.response
