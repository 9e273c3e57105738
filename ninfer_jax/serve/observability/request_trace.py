"""Per-request observation: a RequestTrace follows one generation request from the start of its
preparation to its single terminal record.

`generation.prepare_*` opens a trace (`RequestObserver.begin`); a preparation or submission
failure ends it as `request_rejected` (no `request_start`); a successful submit writes
`request_start`; the OutputAssembler hands it every engine event it consumes, and the terminal
event writes `request_done` (the engine returned an outcome) or `request_error` (a failure
before any outcome). The same points update the request-level Prometheus metrics and write the
stderr lifecycle lines. Records carry ids, counts and seconds only (record builders live in
trace_records.py).

A started request whose reply then fails for a reason of the server's own (rendering a body
or an event, storing a Response: `response_failed`) counts once in response_failures. Before
the engine's outcome that failure is the request's terminal `request_error` (stage
`response`); after it, `request_done` stands and the failure is an operational line only.

Exactly one terminal record per started request: it is written under the trace's lock, once.
A consumer that abandons its request (the client went away mid-stream) says so
(`OutputAssembler.release` -> `RequestObserver.release`): the request is cancelled and the
releasing thread reads the handle on to the engine's terminal event (one engine round after
the cancellation), so request_done is written as soon as the engine ended the request; only
if that takes longer than `release_wait_s` does the reaper take it over, at its next tick. A
consumer that stops reading without saying so is found by the reaper thread, which takes the
handle over after a grace period. Either way the engine's terminal event ends the trace,
and one thread at a time reads a handle (`RequestTrace.claim`).
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import math
import re
import threading
import time

from ninfer_jax.engine.request import Failed, Finished, Tokens
from ninfer_jax.errors import EngineUnavailable, InternalError, NinferError
from ninfer_jax.serve.observability import trace_records as records

log = logging.getLogger("ninfer_jax.serve.requests")

# How long a cancelled request's consumer may keep reading before the reaper takes over
# (Responses keeps reading up to 2 s after a disconnect to store the cancelled response).
ABANDON_GRACE_S = 5.0
# How long a releasing consumer's thread reads on for the terminal event before it leaves
# the request to the reaper (the same bound as a Responses stream storing its cancellation).
RELEASE_WAIT_S = 2.0
# How long the reaper waits for the engine's terminal event of a taken-over request.
TAKEOVER_TIMEOUT_S = 30.0
REAPER_TICK_S = 1.0


class RequestTrace:
    def __init__(self, observer: "RequestObserver", request_id: str, request_seq: int,
                 options, conversation):
        self.observer = observer
        self.request_id = request_id
        self.request_seq = request_seq
        self.began_at = time.monotonic()
        self.shape = records.request_shape(options, conversation)
        self.seed_source = records.seed_source(options, observer.ctx.config.sampling)
        self.prepared = None
        self.handle = None
        self.assembler = None
        self.submitted_at: float | None = None
        self.first_token_at: float | None = None
        self.cancel_noticed_at: float | None = None
        self.is_claimed = False  # a thread other than the consumer reads the handle
        self._lock = threading.Lock()
        self.is_done = False  # a terminal (or rejection) record was written
        self.has_response_failure = False  # response_failed counted this request

    # ------------------------------------------------------------------ preparation

    @contextlib.contextmanager
    def rejecting(self, stage: str):
        """Any failure inside the block is this request's synchronous rejection."""
        try:
            yield self
        except NinferError as error:
            self._reject(error, stage)
            raise
        except Exception:
            self._reject(InternalError("The server hit an internal error."), stage)
            raise

    def attach(self, prepared):
        prepared.trace = self
        self.prepared = prepared
        return prepared

    def _reject(self, error: NinferError, stage: str) -> None:
        with self._lock:
            if self.is_done:
                return
            self.is_done = True
        body = records.rejected(self, error, stage)
        self.observer.emit("request_rejected", body)
        self.observer.count("rejected")
        log.info("request %s rejected: %s %s%s", self.request_id, body["error"]["status"],
                 error.code, f" (param {loggable_param(error.param)})" if error.param else "")

    def started(self, handle) -> None:
        self.handle = handle
        self.submitted_at = time.monotonic()
        self.observer.track(self)
        body = records.started(self)
        self.observer.emit("request_start", body)
        log.info("request %s start %s: prompt %d tokens, max %d, %s, %s", self.request_id,
                 self.shape["protocol"], body["prompt_tokens"], body["max_tokens"],
                 "greedy" if body["sampling"]["greedy"] else
                 f"sampled ({self.seed_source} seed)", body["priority"])

    # ------------------------------------------------------------------ generation

    def watch(self, assembler) -> None:
        self.assembler = assembler

    def on_event(self, event, assembler=None) -> None:
        """Every engine event the consumer (or the reaper) took from the handle."""
        if isinstance(event, Tokens) and self.first_token_at is None:
            self.first_token_at = event.time
            metrics = self.observer.metrics
            if metrics is not None:
                metrics.ttft.observe(max(event.time - self.began_at, 0.0))
        elif isinstance(event, Finished):
            self._terminal(lambda: self._done(event, assembler))
        elif isinstance(event, Failed):
            self._terminal(lambda: self._error(event.error, event.time))

    def claim(self) -> bool:
        """True for the one thread that takes the abandoned handle over."""
        with self._lock:
            if self.is_claimed or self.is_done:
                return False
            self.is_claimed = True
            return True

    def unclaim(self) -> None:
        with self._lock:
            self.is_claimed = False

    def released(self) -> None:
        """The consumer reads no more (see OutputAssembler.release)."""
        self.observer.release(self)

    def fail_without_outcome(self, error: NinferError, stage: str | None = None) -> None:
        self._terminal(lambda: self._error(error, time.monotonic(), stage))

    def response_failed(self, error: Exception) -> None:
        """The reply of this started request failed on the server's side; counted once."""
        with self._lock:
            if self.has_response_failure or self.handle is None:
                return
            self.has_response_failure = True
        metrics = self.observer.metrics
        if metrics is not None:
            metrics.response_failures.inc()
        failure = error if isinstance(error, NinferError) else InternalError(
            "The server hit an internal error.")
        if not self.is_done:
            # No outcome yet: the request ends here (its handle is being cancelled, and
            # the cancellation's Finished event must not turn it into `cancelled`).
            self.fail_without_outcome(failure, stage="response")
            return
        log.warning("request %s: the response failed after its outcome: %s %s",
                    self.request_id, failure.status, failure.code)

    def _terminal(self, write) -> None:
        with self._lock:
            if self.is_done:
                return
            self.is_done = True
        try:
            write()
        finally:
            self.observer.untrack(self)

    def _done(self, finished: Finished, assembler) -> None:
        result = None
        if assembler is not None and assembler.finished is finished:
            try:
                result = assembler.result()
            except Exception:  # noqa: BLE001 - the record is written from the event alone
                log.exception("request %s: the reply could not be assembled", self.request_id)
        body = records.done(self, finished, result)
        if finished.counters.get("preemptions"):
            self.observer.emit("request_scheduling", records.scheduling_terminal(
                self, finished, self.observer.engine_stats()))
        self.observer.emit("request_done", body)
        metrics = self.observer.metrics
        if metrics is not None:
            metrics.requests.labels(finished.reason).inc()
            metrics.duration.observe(body["timings_seconds"]["total"])
            metrics.queue.observe(body["timings_seconds"]["queue"])
        tokens, timings = body["tokens"], body["timings_seconds"]
        log.info("request %s done %s: prompt %d (cache %d, %s), completion %d, ttft %s, "
                 "total %.3fs", self.request_id, body["finish_reason"], tokens["prompt"],
                 tokens["cached"], body["prefix_reuse_path"], tokens["completion"],
                 "-" if timings["ttft"] is None else f"{timings['ttft']:.3f}s",
                 timings["total"])
        # A tool call returned as text is warned about once, by the OutputAssembler.

    def _error(self, error: NinferError, when: float, stage: str | None = None) -> None:
        body = records.errored(self, error, when, stage)
        self.observer.emit("request_error", body)
        self.observer.count("timeout" if error.code == "request_queue_timeout" else "failed")
        log.warning("request %s failed: %s %s", self.request_id, body["error"]["status"],
                    error.code)


_PLAIN_PARAM = re.compile(r"[A-Za-z0-9_.\[\]]{1,80}")


def loggable_param(param: str) -> str:
    """A parameter path for stderr: member names come from the client (metadata keys, schema
    properties), so a path that is not plain identifiers is not copied into the log."""
    return param if _PLAIN_PARAM.fullmatch(param) else "(a client-named field)"


class NullTrace:
    """Used when no observer is registered (apps built without the observability services)."""

    @contextlib.contextmanager
    def rejecting(self, stage: str):
        yield self

    def attach(self, prepared):
        return prepared

    def started(self, handle) -> None:
        pass

    def watch(self, assembler) -> None:
        pass

    def on_event(self, event, assembler=None) -> None:
        pass

    def response_failed(self, error: Exception) -> None:
        pass

    def released(self) -> None:
        pass


NULL_TRACE = NullTrace()


def begin(ctx, request_id: str, options, conversation=None):
    observer = ctx.extras.get("observer")
    if observer is None:
        return NULL_TRACE
    return observer.begin(request_id, options, conversation)


class RequestObserver:
    """The worker's request bookkeeping: numbering, the active set, the reaper thread."""

    def __init__(self, ctx, writer):
        self.ctx = ctx
        self.writer = writer
        self._numbers = itertools.count(1)  # monotonic within this server instance
        self._lock = threading.Lock()
        self._active: dict[str, RequestTrace] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.abandon_grace_s = ABANDON_GRACE_S
        self.release_wait_s = RELEASE_WAIT_S

    @property
    def metrics(self):
        return self.ctx.extras.get("metrics")

    def begin(self, request_id: str, options, conversation=None) -> RequestTrace:
        return RequestTrace(self, request_id, next(self._numbers), options, conversation)

    def emit(self, event: str, record: dict) -> None:
        if self.writer is not None:
            self.writer.emit(event, record)

    def count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.requests.labels(outcome).inc()

    def engine_stats(self):
        return self.ctx.engine.stats()

    def track(self, trace: RequestTrace) -> None:
        with self._lock:
            self._active[trace.request_id] = trace

    def untrack(self, trace: RequestTrace) -> None:
        with self._lock:
            if self._active.get(trace.request_id) is trace:
                del self._active[trace.request_id]

    def active(self) -> list[RequestTrace]:
        with self._lock:
            return list(self._active.values())

    # ------------------------------------------------------------------ engine thread

    def on_scheduling(self, event) -> None:
        """Engine-thread listener (pause / restore / replay transitions): only enqueues."""
        # One dict read (atomic under the GIL): the engine thread never waits on our lock.
        trace = self._active.get(event.request_id)
        if trace is not None and self.writer is not None:
            self.writer.emit("request_scheduling",
                             records.scheduling(trace, event, self.engine_stats()))

    # ------------------------------------------------------------------ reaper

    def start(self) -> None:
        self._thread = threading.Thread(target=self._reap_forever, name="ninfer-reaper",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _reap_forever(self) -> None:
        while not self._stop.wait(REAPER_TICK_S):
            try:
                self.reap(time.monotonic())
            except Exception:  # noqa: BLE001 - the reaper must survive any single request
                log.exception("request reaper failed")

    def reap(self, now: float) -> None:
        """Take over requests whose consumer cancelled and stopped reading."""
        for trace in self.active():
            if trace.is_done or trace.handle is None or not trace.handle.cancel_requested:
                continue
            if trace.cancel_noticed_at is None:
                trace.cancel_noticed_at = now
            elif now - trace.cancel_noticed_at >= self.abandon_grace_s and trace.claim():
                self._read_to_end(trace, time.monotonic() + TAKEOVER_TIMEOUT_S)
                if not trace.is_done:
                    trace.fail_without_outcome(EngineUnavailable(
                        "the engine published no terminal event for the cancelled request"))

    def release(self, trace: RequestTrace) -> None:
        """On the releasing consumer's thread: read the cancelled request on to its terminal
        event (the engine ends it at its next round), so its record is not left to the
        reaper's grace period; past `release_wait_s` the reaper takes it at its next tick."""
        if trace.handle is None or not trace.claim():
            return
        self._read_to_end(trace, time.monotonic() + self.release_wait_s)
        if not trace.is_done:
            trace.cancel_noticed_at = -math.inf  # the grace is over: the next tick takes it
            trace.unclaim()

    @staticmethod
    def _read_to_end(trace: RequestTrace, deadline: float) -> None:
        while not trace.is_done and time.monotonic() < deadline:
            event = trace.handle.next_event(timeout=min(0.5, max(0.0,
                                                                 deadline - time.monotonic())))
            if event is None:
                continue
            assembler = trace.assembler
            try:
                if assembler is not None:
                    assembler.feed(event)  # the assembler reports the event to the trace
                    continue
            except Exception:  # noqa: BLE001 - an output-parser failure must not lose the record
                log.exception("request %s: replaying abandoned output failed", trace.request_id)
            trace.on_event(event, None)
