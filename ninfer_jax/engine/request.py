"""What crosses the engine boundary: the request going in and the events coming out.

HTTP threads build a `GenerationRequest` (token ids and numbers only: no JSON, no text to
parse) and get back a `RequestHandle` whose events they consume. The engine thread is the
only writer of a handle's event queue; `cancel()` and `stop_at()` are safe from any thread.
Every handle receives exactly one terminal event (`Finished` or `Failed`).
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import NamedTuple, Protocol, Sequence, Union

from ninfer_jax.errors import NinferError
from ninfer_jax.model.limits import TOP_K_CAP  # noqa: F401 - the engine's public name too


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Resolved per-request sampling. temperature 0 (or greedy) means exact argmax."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 -> TOP_K_CAP
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0  # always set: the HTTP layer draws a fresh one when the client gave none

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0


class TokenPolicy(Protocol):
    """Forced-token rules evaluated by the engine after each sampled token.

    `adjust(output_ids, sampled)` sees the committed output so far and the token just sampled,
    and returns the tokens to commit instead (usually `[sampled]`; several to insert a control
    suffix such as a thinking-budget close marker; the rule must depend only on the tokens
    before it, so batching and replay do not change the result). Plain Python, no device work.
    A policy may also offer `automaton(vocab_size)` (engine/policy_lanes.py): the same rule
    as data the step applies, so its request rides the launch-ahead pipeline.
    """

    def adjust(self, output_ids: Sequence[int], sampled: int) -> list[int]: ...


@dataclasses.dataclass(frozen=True)
class MediaInput:
    """One image or video of a prompt, prepared for the vision tower (serve/media).

    `pixel_values` holds what transformers' Qwen VL processors return for this item alone
    (rows in the processor's patch order); the vision tower's output after the spatial merge
    has one row per placeholder token, and those rows replace the prompt's token embeddings
    at `spans`, in order. `digest` identifies the bytes (prefix reuse must match it)."""

    kind: str  # "image" | "video"
    digest: str  # SHA-256 hex of the source bytes
    grid_thw: tuple[int, int, int]  # patches: temporal groups, rows, columns
    spans: tuple[tuple[int, int], ...]  # (prompt offset, length) runs of its pad tokens
    pixel_values: object  # np.ndarray [t*h*w, 3*temporal_patch*patch*patch] float32, read-only

    @property
    def num_tokens(self) -> int:
        return sum(length for _, length in self.spans)


@dataclasses.dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int  # output budget; 0 = prompt processing only
    # The request's stop tokens (a client's stop_token_ids, plus the model's end tokens unless
    # ignore_eos): always honoured. ignore_eos lifts only the engine's own eos_ids.
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    token_policy: TokenPolicy | None = None
    # Prefix-reuse hints: token offsets worth publishing as shared prefixes, and an
    # optional session key (Responses chains). Neither changes output.
    cache_breakpoints: tuple[int, ...] = ()
    # False (`prompt_cache_options.mode: explicit`): publish pages only up to the last
    # breakpoint; True: every full page (the automatic write).
    cache_implicit: bool = True
    session_key: str | None = None
    arrival_time: float = dataclasses.field(default_factory=time.monotonic)
    deadline: float | None = None  # monotonic time by which admission must happen
    # Background work (TensorFold's `priority: "background"`) waits behind foreground
    # requests and yields its lane or pages to them; its delivered tokens are never repeated.
    background: bool = False
    # TensorFold's per-request `draft: false`: decode this request plainly even when the
    # server speculates (--spec).
    speculative: bool = True
    # Free-form labels for logs (protocol name etc.); never read by scheduling.
    labels: dict = dataclasses.field(default_factory=dict)
    # Images and videos in prompt order (their placeholder tokens are in prompt_ids).
    media: tuple[MediaInput, ...] = ()


# ----------------------------------------------------------------------------- events


@dataclasses.dataclass(frozen=True)
class Admitted:
    cache_n: int  # prompt tokens reused from the prefix cache
    time: float


@dataclasses.dataclass(frozen=True)
class PromptProgress:
    processed: int  # prompt tokens whose KV exists (cache_n included)
    total: int
    cache_n: int
    time: float


class Tokens(NamedTuple):
    """Published for every row of every step: a NamedTuple (built in C), not a dataclass."""

    ids: tuple[int, ...]  # newly committed output tokens, in order
    num_committed: int  # total committed output tokens after these
    time: float


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclasses.dataclass(frozen=True)
class Finished:
    reason: str  # "stop" (eos / stop string), "length" (max_tokens or context), "cancelled"
    usage: Usage
    output_ids: tuple[int, ...]
    # seconds: queue, prefill (admission -> first token), decode (first -> last token), total
    timings: dict
    # scheduling counters: preemptions, replay_restores, replayed_tokens, ...
    counters: dict
    time: float
    matched_stop_token: int | None = None


@dataclasses.dataclass(frozen=True)
class Failed:
    error: NinferError
    time: float


Event = Union[Admitted, PromptProgress, Tokens, Finished, Failed]
TERMINAL = (Finished, Failed)


class RequestHandle:
    """The HTTP thread's view of one request: an event queue plus cancellation controls."""

    def __init__(self, request: GenerationRequest, on_control=None):
        self.request = request
        self._events: "queue.Queue[Event]" = queue.Queue()
        self._lock = threading.Lock()
        self._cancelled = False
        self._stop_at: int | None = None
        self._done = False
        # Called (from any thread) after cancel()/stop_at() so the engine can wake up.
        self._on_control = on_control
        self._sink = None  # forward(): events go to sink(handle, event), not the queue

    # -- engine side
    def publish(self, event: Event) -> None:
        sink = self._sink
        if sink is not None:
            # Forwarded (the engine core): forward() set the sink under the lock after
            # draining the queue, and from then on only the engine thread publishes, so the
            # hot path (a Tokens event per row per step) needs no lock.
            if self._done:
                return
            if isinstance(event, TERMINAL):
                self._done = True
            sink(self, event)
            return
        with self._lock:
            if self._done:
                return
            if isinstance(event, TERMINAL):
                self._done = True
            sink = self._sink
            if sink is None:
                self._events.put(event)
                return
        sink(self, event)

    def forward(self, sink) -> None:
        """Hand every event to `sink(handle, event)` instead of the queue, those published
        so far first, in order. The engine-core process relays a handle's events to the HTTP
        worker that owns the request this way; `sink` runs on the publishing (engine) thread
        and must only enqueue."""
        with self._lock:
            while True:
                try:
                    event = self._events.get_nowait()
                except queue.Empty:
                    break
                sink(self, event)
            self._sink = sink

    @property
    def cancel_requested(self) -> bool:
        return self._cancelled

    @property
    def stop_requested_at(self) -> int | None:
        return self._stop_at

    # -- HTTP side
    def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event, or None when `timeout` seconds pass without one."""
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            return None

    def events(self):
        """Iterate events until (and including) the terminal one."""
        while True:
            event = self._events.get()
            yield event
            if isinstance(event, TERMINAL):
                return

    def cancel(self) -> None:
        """Idempotent: the engine finishes the request with reason 'cancelled' at its next round."""
        with self._lock:
            self._cancelled = True
        if self._on_control:
            self._on_control(self)

    def stop_at(self, num_tokens: int) -> None:
        """A stop string matched: keep exactly `num_tokens` committed output tokens, finish 'stop'."""
        with self._lock:
            if self._stop_at is None or num_tokens < self._stop_at:
                self._stop_at = num_tokens
        if self._on_control:
            self._on_control(self)
