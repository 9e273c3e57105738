"""The output side of one request: engine events in, dialect-neutral deltas and a result out.

`OutputAssembler` runs on the request's HTTP thread. Per committed token it detokenizes
incrementally (never broken UTF-8), withholds stop tokens, matches stop strings across token
boundaries (on a match it calls `handle.stop_at(n)` with the exact number of tokens through
the one that completed the match, and shows nothing from the match on), then splits
reasoning, content and tool calls (text.output_parser). Deltas carry only text that is no
longer ambiguous. `result()` is the final reply: text, reasoning, tool calls, finish reason,
usage (cached and reasoning tokens included) and llama.cpp-style timings.

Waiting: `wait_admitted()` consumes events up to admission (the shared start path of every
dialect, generation.start), and `stream()` the rest. While they wait, both look at the
client's connection every disconnect.POLL_S (a `PeerWatch`; NO_PEER when there is no
socket): a client that went away gets its request cancelled, and the events still drain to
the terminal one, so the request log and metrics see a `cancelled` outcome.

Every dialect renders its reply (a body, or a stream's chunks and events) from one
assembler, so that is where a failure to answer is reported: `response_failed(error)` from
a stream's error path, `answering()` around a non-streamed body. Neither the engine's own
failure (the outcome `failed`) nor a client that left (`cancelled`) is a response failure.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from typing import TYPE_CHECKING, Iterator

from ninfer_jax.engine.request import (Admitted, Failed, Finished, PromptProgress,
                                       RequestHandle, Tokens)
from ninfer_jax.errors import NinferError
from ninfer_jax.serve.wire.disconnect import NO_PEER, POLL_S, ClientGone, PeerWatch
from ninfer_jax.serve.observability.request_trace import NULL_TRACE
from ninfer_jax.serve.observability.timings import TimingClock
from ninfer_jax.text.output_parser import OutputParser
from ninfer_jax.text.stops import StopMatcher
from ninfer_jax.text.tool_stream import ToolParseReport

if TYPE_CHECKING:  # generation.py builds assemblers, so it cannot be imported from here
    from ninfer_jax.serve.core.generation import OutputPlan, PreparedGeneration

log = logging.getLogger("ninfer_jax.serve")

HEARTBEAT = object()  # yielded by `stream()` after a quiet interval (SSE keep-alive)


@dataclasses.dataclass(frozen=True)
class Delta:
    kind: str  # "reasoning" | "content" | "progress"
    text: str = ""
    progress: dict | None = None


@dataclasses.dataclass(frozen=True)
class OutputToolCall:
    id: str
    name: str  # function name without namespace
    namespace: str | None
    arguments: str  # JSON object text


@dataclasses.dataclass
class GenerationResult:
    content: str
    reasoning: str
    tool_calls: list[OutputToolCall]
    finish_reason: str  # stop | length | tool_calls | cancelled
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    timings: dict
    matched_stop: str | None
    tool_report: ToolParseReport
    output_ids: tuple[int, ...]
    counters: dict


class OutputAssembler:
    def __init__(self, handle: RequestHandle, prepared: PreparedGeneration, detokenizer,
                 peer: PeerWatch = NO_PEER):
        self._prepared = prepared
        plan: OutputPlan = prepared.plan
        self.handle = handle
        self._peer = peer
        self.client_gone = False  # the client closed its connection; the request is cancelled
        self._pending: list[Delta] = []  # deltas of the events wait_admitted consumed
        self._plan = plan
        self._detok = detokenizer
        self._stops = StopMatcher(plan.stop_strings, markers=_parsed_markers(plan))
        # (tokens, characters, reasoning tokens) after each token whose text reached the
        # matcher: a match accepted late (it waited on a partial marker) ended earlier.
        self._token_ends: list[tuple[int, int, int]] = []
        self._num_chars = 0
        self._parser = OutputParser(reasoning_markers=plan.reasoning_markers,
                                    starts_in_reasoning=plan.starts_in_reasoning,
                                    tool_format=plan.tool_format, max_calls=plan.max_calls)
        self.clock = TimingClock(len(prepared.request.prompt_ids))
        self._num_tokens = 0
        self._reasoning_tokens = 0
        self._stop_tokens: int | None = None  # tokens through a matched stop string
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._warned_fallback = False
        self.finished: Finished | None = None
        self.error: NinferError | None = None
        # The request log follows every event this assembler consumes (request_trace.py).
        self._trace = prepared.trace or NULL_TRACE
        self._trace.watch(self)

    @property
    def done(self) -> bool:
        return self.finished is not None or self.error is not None

    # ------------------------------------------------------------------ consuming events

    def stream(self, heartbeat_s: float | None = None) -> Iterator[Delta | object]:
        """Deltas until the terminal event. With `heartbeat_s`, HEARTBEAT whenever that long
        passed without visible text: while waiting, prefilling, or while the tokens that
        arrive are all held back (a long tool-call region).

        A consumer that stops early (an exception, or closing the generator when the client
        goes away) cancels the request, so nothing keeps running unobserved."""
        try:
            yield from self._deltas(heartbeat_s)
        finally:
            if not self.done:
                self.handle.cancel()

    def _deltas(self, heartbeat_s: float | None) -> Iterator[Delta | object]:
        pending, self._pending = self._pending, []
        yield from pending
        last_visible = time.monotonic()
        while not self.done:
            timeout = None
            if heartbeat_s is not None:
                timeout = max(0.0, last_visible + heartbeat_s - time.monotonic())
            event = self._next_event(timeout)
            if event is not None:
                deltas = self.feed(event)
                yield from deltas
                if any(d.kind != "progress" for d in deltas):
                    last_visible = time.monotonic()
                    continue
            if heartbeat_s is not None and time.monotonic() - last_visible >= heartbeat_s:
                yield HEARTBEAT
                last_visible = time.monotonic()

    def wait_admitted(self) -> Admitted | None:
        """Consume events up to admission; `stream()` later yields their deltas first.

        Returns the Admitted event (None if the request finished without one). A failure
        before admission (queue timeout) is raised as the error it is; a client that went
        away while its request waited raises ClientGone once the cancellation has ended it.
        """
        while not self.done:
            event = self._next_event(None)
            self._pending += self.feed(event)
            if isinstance(event, Admitted) and not self.client_gone:
                return event
        if self.client_gone:
            raise ClientGone(f"request {self.handle.request.request_id}: the client closed "
                             "its connection before the reply started")
        if self.error is not None:
            raise self.error
        return None

    def _next_event(self, timeout: float | None):
        """The handle's next event (None after `timeout`). While a client socket is watched,
        wake at least every POLL_S to look at it, and cancel the request once it closed."""
        if not self._peer.is_watching:
            return self.handle.next_event(timeout=timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = POLL_S if deadline is None else min(
                POLL_S, max(0.0, deadline - time.monotonic()))
            event = self.handle.next_event(timeout=wait)
            if not self.client_gone and self._peer.due() and self._peer.is_closed():
                self._client_went_away()
            if event is not None or (deadline is not None and time.monotonic() >= deadline):
                return event

    def _client_went_away(self) -> None:
        self.client_gone = True
        log.info("request %s: the client closed its connection; cancelling",
                 self.handle.request.request_id)
        self.handle.cancel()

    def release(self) -> None:
        """This consumer reads no more events (its stream closed before the terminal event:
        the client went away). A request that has not ended is cancelled, and the request
        log's observer reads it on to the engine's terminal event right away, so its
        request_done follows the cancellation instead of the reaper's grace period."""
        if not self.done:
            self.handle.cancel()
            self._trace.released()

    def response_failed(self, error: Exception) -> None:
        """The reply could not be delivered for a reason of the server's own (request_trace
        counts it once per request)."""
        if error is self.error or isinstance(error, ClientGone):
            return
        self._trace.response_failed(error)

    @contextlib.contextmanager
    def answering(self):
        """Around the rendering of a non-streamed reply: what fails inside is a response
        failure (and still goes on to the error handler)."""
        try:
            yield
        except Exception as error:
            self.response_failed(error)
            raise

    def run_to_end(self) -> "GenerationResult":
        """Consume every event; raises the request's error if it failed."""
        for _ in self.stream():
            pass
        if self.error is not None:
            raise self.error
        return self.result()

    def feed(self, event) -> list[Delta]:
        try:
            return self._apply(event)
        finally:
            self._trace.on_event(event, self)

    def _apply(self, event) -> list[Delta]:
        if isinstance(event, Tokens):
            return self._on_tokens(event)
        if isinstance(event, Admitted):
            return self._progress(self.clock.admitted(event))
        if isinstance(event, PromptProgress):
            return self._progress(self.clock.prompt_progress(event))
        if isinstance(event, Finished):
            self.finished = event
            self._prepared.release_media()
            return self._finish()
        if isinstance(event, Failed):
            self.error = event.error
            self._prepared.release_media()
        return []

    def _progress(self, progress: dict | None) -> list[Delta]:
        return [Delta("progress", progress=progress)] if progress else []

    def _on_tokens(self, event: Tokens) -> list[Delta]:
        deltas = self._progress(self.clock.first_output(event.time))
        self.clock.tokens(event.time, event.num_committed)
        for token in event.ids:
            self._num_tokens += 1
            if self._stop_tokens is not None or token in self._plan.hidden_token_ids:
                continue
            was_reasoning = self._parser.in_reasoning
            deltas += self._parse(self._push_text(self._detok.push([token])))
            if was_reasoning or self._parser.in_reasoning:
                self._reasoning_tokens += 1
            if self._plan.stop_strings:
                self._token_ends.append((self._num_tokens, self._num_chars,
                                         self._reasoning_tokens))
            if self._stops.match is not None:
                self._stopped()
                self.handle.stop_at(self._stop_tokens)
        return deltas

    def _push_text(self, text: str) -> str:
        self._num_chars += len(text)
        return self._stops.push(text)

    def _stopped(self) -> None:
        """Usage counts the tokens through the one whose text completed the match."""
        end = self._stops.match.end
        self._stop_tokens, _, self._reasoning_tokens = next(
            (entry for entry in self._token_ends if entry[1] >= end),
            (self._num_tokens, self._num_chars, self._reasoning_tokens))

    def _finish(self) -> list[Delta]:
        deltas = []
        if self._stop_tokens is None:
            deltas += self._parse(self._push_text(self._detok.flush()))
            deltas += self._parse(self._stops.flush())
            if self._stops.match is not None:
                self._stopped()
        for piece in self._parser.finish():
            deltas += self._record(piece.kind, piece.text)
        return deltas

    def _parse(self, text: str) -> list[Delta]:
        deltas: list[Delta] = []
        if text:
            for piece in self._parser.push(text):
                deltas += self._record(piece.kind, piece.text)
        return deltas

    def _record(self, kind: str, text: str) -> list[Delta]:
        if not text:
            return []
        (self._reasoning if kind == "reasoning" else self._content).append(text)
        return [Delta(kind, text)]

    # ------------------------------------------------------------------ the final reply

    def tool_calls(self) -> list[OutputToolCall]:
        by_name = {tool.qualified_name: tool for tool in self._plan.tools}
        calls = []
        for parsed in self._parser.calls:
            tool = by_name.get(parsed.name)
            name = tool.name if tool else parsed.name
            namespace = tool.namespace if tool else None
            calls.append(OutputToolCall(f"call_{secrets.token_hex(12)}", name, namespace,
                                        parsed.arguments))
        return calls

    def result(self) -> GenerationResult:
        """The reply after a Finished event (an error is raised by the caller instead)."""
        finished = self.finished
        calls = self.tool_calls()
        report = self._parser.report
        if report.fallback_reason != "none" and not self._warned_fallback:
            # Once per request (result() is read by the dialect and by the request trace);
            # only the classification, never the generated markup (the spec's log rule).
            self._warned_fallback = True
            log.warning("request %s: a tool call was returned as text (%s)",
                        self.handle.request.request_id, report.fallback_reason)
        if self._stop_tokens is not None:
            reason = "stop"
            completion = min(self._stop_tokens, finished.usage.completion_tokens)
        else:
            reason = finished.reason
            completion = finished.usage.completion_tokens
        if calls and reason == "stop":
            reason = "tool_calls"
        usage = finished.usage
        self.clock.finish(finished.time, usage.cached_tokens, completion)
        return GenerationResult(
            content="".join(self._content), reasoning="".join(self._reasoning),
            tool_calls=calls, finish_reason=reason, prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens, completion_tokens=completion,
            reasoning_tokens=min(self._reasoning_tokens, completion),
            timings=_with_drafts(self.clock.timings(), finished.counters),
            matched_stop=self._stops.match.stop
            if self._stops.match else None, tool_report=self._parser.report,
            output_ids=tuple(finished.output_ids[:completion]), counters=dict(finished.counters))


def _parsed_markers(plan: OutputPlan) -> tuple[str, ...]:
    """The markers the output parser consumes: atomic for stop strings (text/stops.py)."""
    markers = tuple(plan.reasoning_markers or ())
    if plan.tool_format is not None:
        markers += (plan.tool_format.opener, plan.tool_format.closer)
    return markers


def _with_drafts(timings: dict, counters: dict) -> dict:
    """llama.cpp's terminal draft_n / draft_n_accepted, when the request drafted at all."""
    drafted = counters.get("spec_drafted", 0)
    if drafted:
        timings = {**timings, "draft_n": drafted,
                   "draft_n_accepted": counters.get("spec_accepted", 0)}
    return timings
