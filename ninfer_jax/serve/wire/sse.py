"""Server-sent events framing: the Chat/Completions streams and the named frames.

`openai_event_stream(chunks, on_close)` turns an iterator of JSON-ready dicts (and HEARTBEAT
markers) into SSE bytes: `data: {...}` per chunk, `: keep-alive` for a heartbeat, and
`data: [DONE]` at the end. A failure after the stream has opened cannot change the HTTP status
any more, so it becomes one error event (the dialect's error body) followed by [DONE], and
is handed to `on_failure` (the assembler's response_failed).
`on_close` always runs, also when the client disconnects (the WSGI server closes the
generator), which is where the request is cancelled and released (OutputAssembler.release).

`builder_frames(assembler, feed, take_events)` is the generation loop of the named-frame
dialects (Responses, Anthropic): deltas go to the dialect's event builder, its new events
leave at once, and a quiet interval becomes the same keep-alive comment.
"""
from __future__ import annotations

import json
import logging
from typing import Callable, Iterable, Iterator

import falcon

from ninfer_jax.errors import InternalError, NinferError
from ninfer_jax.serve.core.errors import openai_error_body
from ninfer_jax.serve.core.output import HEARTBEAT, OutputAssembler

log = logging.getLogger("ninfer_jax.serve")

KEEPALIVE_SECONDS = 5.0
KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"


def sse_data(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n"


def sse_frame(event: dict) -> bytes:
    """One named SSE frame whose event name is the JSON's type (the Responses and Anthropic
    streams)."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def sse_frames(events: Iterable[dict]) -> bytes:
    return b"".join(sse_frame(event) for event in events)


def builder_frames(assembler: OutputAssembler, feed: Callable[[object], None],
                   take_events: Callable[[], list[dict]]) -> Iterator[bytes]:
    """SSE bytes while the request generates: `feed(delta)` per delta, then the builder's
    new events (`take_events()`) as named frames; KEEPALIVE after KEEPALIVE_SECONDS of
    nothing visible. Ends at the terminal event (the caller renders the finish)."""
    for item in assembler.stream(heartbeat_s=KEEPALIVE_SECONDS):
        if item is HEARTBEAT:
            yield KEEPALIVE
            continue
        feed(item)
        events = take_events()
        if events:
            yield sse_frames(events)


def openai_event_stream(chunks: Iterable, on_close: Callable[[], None],
                        request_id: str | None = None,
                        on_failure: Callable[[Exception], None] = lambda error: None,
                        ) -> Iterator[bytes]:
    try:
        try:
            for chunk in chunks:
                yield KEEPALIVE if chunk is HEARTBEAT else sse_data(chunk)
        except NinferError as error:
            on_failure(error)
            yield sse_data(openai_error_body(error))
        except Exception as error:
            log.exception("stream failed after it opened (request %s)", request_id or "-")
            on_failure(error)
            yield sse_data(openai_error_body(InternalError("The server hit an internal error.")))
        yield DONE
    finally:
        # The chunks' generators (the assembler's stream among them) end first, so on_close
        # is the only reader of the request from here on.
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
        on_close()


def start_sse(resp: falcon.Response, body: Iterator[bytes]) -> None:
    resp.content_type = "text/event-stream; charset=utf-8"
    resp.set_header("Cache-Control", "no-cache")
    resp.set_header("X-Accel-Buffering", "no")
    resp.stream = body
