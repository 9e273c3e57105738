"""Send one captured request and time it from the client's side.

The body goes out exactly as captured. A streamed request is read event by event: its TTFT is
the time to the first event that carries output (text, reasoning or a tool-call delta; role
chunks and lifecycle events do not count) and its gaps are the times between later output
events. A non-streamed request gets its latency only (the server log supplies TTFT and decode
time for those). The request id of the replayed request comes from the response header
(`x-request-id`, or Anthropic's `request-id` spelled `req_<id>`), which is the id the
server's request log uses.
"""
from __future__ import annotations

import dataclasses
import json
import time

import httpx

from ninfer_jax.replay.records import Capture


@dataclasses.dataclass
class Sent:
    capture: Capture
    status: int | None = None  # HTTP status; None when the request could not be sent
    request_id: str | None = None  # the replayed request's id (request log key)
    streamed: bool = False
    started_at: float = 0.0
    latency: float = 0.0
    ttft: float | None = None  # streamed requests only
    gaps: list[float] = dataclasses.field(default_factory=list)
    completion_tokens: int | None = None  # from the response usage, when it carries one
    error: str | None = None


def _log_id(response: httpx.Response) -> str | None:
    value = response.headers.get("x-request-id") or response.headers.get("request-id")
    return value.removeprefix("req_") if value else None


def _has_output(payload: dict) -> bool:
    """Whether one streamed event of any dialect carries generated output."""
    kind = payload.get("type")
    if kind == "content_block_delta":  # Anthropic
        return True
    if isinstance(kind, str) and kind.endswith(".delta"):  # Responses
        return bool(payload.get("delta"))
    for choice in payload.get("choices") or ():  # Chat and Completions
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or delta.get("reasoning_content") \
                or delta.get("tool_calls"):
            return True
    return False


def _usage_tokens(payload: dict) -> int | None:
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        response = payload.get("response") or payload.get("message") or {}
        usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    for key in ("completion_tokens", "output_tokens"):
        if isinstance(usage.get(key), int):
            return usage[key]
    return None


def _read_stream(response: httpx.Response, sent: Sent) -> None:
    last_output = None
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            break
        try:
            payload = json.loads(data)
        except ValueError:
            continue
        now = time.perf_counter()
        tokens = _usage_tokens(payload)
        if tokens is not None:
            sent.completion_tokens = tokens
        if not _has_output(payload):
            continue
        if last_output is None:
            sent.ttft = now - sent.started_at
        else:
            sent.gaps.append(now - last_output)
        last_output = now


def send(client: httpx.Client, capture: Capture) -> Sent:
    sent = Sent(capture, streamed=capture.body.get("stream") is True)
    sent.started_at = time.perf_counter()
    try:
        with client.stream("POST", capture.endpoint, json=capture.body) as response:
            sent.status = response.status_code
            sent.request_id = _log_id(response)
            if response.status_code != 200:
                response.read()
                sent.error = _error_summary(response)
            elif sent.streamed:
                _read_stream(response, sent)
            else:
                sent.completion_tokens = _usage_tokens(json.loads(response.read()))
    except (httpx.HTTPError, ValueError) as exc:
        sent.error = f"{type(exc).__name__}: {exc}"
    sent.latency = time.perf_counter() - sent.started_at
    return sent


def _error_summary(response: httpx.Response) -> str:
    try:
        body = response.json()
        error = body.get("error") or {}
        return str(error.get("code") or error.get("type") or response.status_code)
    except ValueError:
        return str(response.status_code)
