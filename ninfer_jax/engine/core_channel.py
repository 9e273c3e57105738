"""What crosses the channel between HTTP workers and the engine-core process.

Plain dataclasses, pickled by `multiprocessing.connection` over one Unix socket per worker.
A worker names each request by a key of its own (`Submit.key`), so nothing depends on
request ids being unique. The payloads are the engine seam's own types (GenerationRequest,
the handle events of engine/request.py, EngineStats, SchedulingEvent, errors.NinferError).

Worker -> core: `Submit` (answered by a `SubmitReply` before any event of that request),
`Control` (a handle's cancel / stop_at).
Core -> worker: `Batch` messages only. One carries, in order, everything the core produced for
that worker since the previous one (in practice the events of one engine round: the engine
thread holds the GIL while it publishes a round) and the engine's latest stats snapshot.
"""
from __future__ import annotations

import dataclasses
import socket
from typing import Any, NamedTuple

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.request import Event, GenerationRequest
from ninfer_jax.engine.stats import EngineStats
from ninfer_jax.errors import NinferError

# An idle core still pushes a changed stats snapshot (warm-up done, gauges) this often.
STATS_PUSH_S = 0.1


@dataclasses.dataclass(frozen=True)
class Submit:
    key: int
    request: GenerationRequest


@dataclasses.dataclass(frozen=True)
class Control:
    key: int
    cancel: bool
    stop_at: int | None


@dataclasses.dataclass(frozen=True)
class Hello:
    """The engine is built (warm-up may still run): what the worker's EngineClient exposes."""

    config: EngineConfig
    pool_tokens: int
    runtime: dict  # what JAX runs on in the core (version, backend, devices), for logs


@dataclasses.dataclass(frozen=True)
class SubmitReply:
    key: int
    error: NinferError | None  # the synchronous refusal Engine.submit raised, if any


class Relayed(NamedTuple):
    """One handle event (one per row per step: a NamedTuple, cheap to build and pickle).
    With the terminal event comes what the engine-side copy of the request's token policy
    recorded (`outcome()`), for the worker's copy to adopt."""

    key: int
    event: Event
    policy_outcome: Any = None


@dataclasses.dataclass(frozen=True)
class Batch:
    items: list  # Hello | SubmitReply | Relayed | lifecycle.SchedulingEvent, in order
    stats: EngineStats | None  # None until the engine is built


def hang_up(conn) -> None:
    """End a connection whose reader thread may be blocked in recv(): shut the socket down
    (the reader sees EOF and closes it) instead of closing the descriptor under it."""
    try:
        with socket.socket(fileno=conn.fileno()) as sock:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.detach()  # the Connection still owns the descriptor
    except (OSError, ValueError):
        pass  # already closed
