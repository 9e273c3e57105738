"""Building Anthropic Message objects and their SSE block lifecycle from neutral output.

`MessageBuilder` is fed one reply's pieces in order (thinking text, answer text, completed
tool calls, then the finish) and keeps both the aggregate content blocks and the stream of
events: message_start, ping, content_block_start / *_delta / content_block_stop per block
(a thinking block sends its signature_delta before closing), message_delta with cumulative
usage, message_stop. Visible thinking carries an opaque compatibility signature; request
lowering ignores signatures, so retained history stays valid across restarts.
"""
from __future__ import annotations

import copy
import hashlib
import json

from ninfer_jax.serve.wire.json_body import loads_finite
from ninfer_jax.serve.core.fields import new_id

SIGNATURE_PREFIX = "ninfer-thinking-"


def thinking_signature(text: str) -> str:
    return SIGNATURE_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:32]


def usage_object(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict:
    """Anthropic usage: input_tokens excludes the verified cache read; creation is unknown."""
    return {"input_tokens": prompt_tokens - cached_tokens,
            "cache_creation_input_tokens": None,
            "cache_read_input_tokens": cached_tokens,
            "output_tokens": output_tokens}


class MessageBuilder:
    def __init__(self, model: str):
        self.message = {"id": new_id("msg"), "type": "message", "role": "assistant",
                        "model": model, "content": [], "stop_reason": None,
                        "stop_sequence": None, "usage": None}
        self.events: list[dict] = []
        self._open: dict | None = None

    def take_events(self) -> list[dict]:
        events, self.events = self.events, []
        return events

    def _emit(self, event_type: str, **payload) -> None:
        self.events.append({"type": event_type, **payload})

    def start(self, prompt_tokens: int, cached_tokens: int) -> None:
        """message_start once admission has fixed the cached-prefix split, then a ping."""
        self.message["usage"] = usage_object(prompt_tokens, cached_tokens, 0)
        self._emit("message_start", message=copy.deepcopy(self.message))
        self._emit("ping")

    @property
    def _index(self) -> int:
        return len(self.message["content"]) - 1

    def thinking(self, text: str) -> None:
        if text:
            self._delta("thinking", text)

    def text(self, text: str) -> None:
        if text:
            self._delta("text", text)

    def _delta(self, kind: str, text: str) -> None:
        if self._open is None or self._open["type"] != kind:
            self._close_open()
            block = ({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                     else {"type": "text", "text": ""})
            self._start_block(block)
        self._open[kind] += text
        delta = ({"type": "thinking_delta", "thinking": text} if kind == "thinking"
                 else {"type": "text_delta", "text": text})
        self._emit("content_block_delta", index=self._index, delta=delta)

    def _start_block(self, block: dict) -> None:
        self.message["content"].append(block)
        self._open = block
        self._emit("content_block_start", index=self._index, content_block=copy.deepcopy(block))

    def _close_open(self) -> None:
        block, self._open = self._open, None
        if block is None:
            return
        if block["type"] == "thinking":
            block["signature"] = thinking_signature(block["thinking"])
            self._emit("content_block_delta", index=self._index,
                       delta={"type": "signature_delta", "signature": block["signature"]})
        self._emit("content_block_stop", index=self._index)

    def tool_use(self, name: str, arguments: str) -> None:
        self._close_open()
        tool_input, changed = loads_finite(arguments)
        if changed:  # the streamed partial_json must parse to the same input
            arguments = json.dumps(tool_input, ensure_ascii=False)
        self._start_block({"type": "tool_use", "id": new_id("toolu"), "name": name, "input": {}})
        self._open["input"] = tool_input
        self._emit("content_block_delta", index=self._index,
                   delta={"type": "input_json_delta", "partial_json": arguments})
        self._close_open()

    def finish(self, stop_reason: str, usage: dict, stop_sequence: str | None = None) -> dict:
        self._close_open()
        self.message.update(stop_reason=stop_reason, stop_sequence=stop_sequence, usage=usage)
        self._emit("message_delta",
                   delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                   usage=dict(usage))
        self._emit("message_stop")
        return self.message

    def fail(self, error_body: dict) -> None:
        """An error after the stream opened: the Anthropic `error` event, carrying the same
        request_id as a non-streamed error body (and the request-id header)."""
        self._emit("error", error=error_body["error"], request_id=error_body.get("request_id"))
