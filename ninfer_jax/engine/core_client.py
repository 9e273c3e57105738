"""EngineClient: the engine as an HTTP worker sees it, across the channel to the engine core.

The same surface as Engine (submit -> RequestHandle, stats, healthy, ready / wait_ready,
pool_tokens, config, add_scheduling_listener, shutdown), so the serve layer cannot tell them
apart. This module imports no JAX: HTTP workers never touch the device.

Threading: HTTP threads call `submit` (it sends the request and waits for the core's reply,
so Engine.submit's synchronous refusals are raised here as they are in-process), a handle's
`cancel`/`stop_at` (a Control message) and `stats` (the snapshot the core pushed last, a
reference read). One receiver thread reads the core's batches: it swaps in the stats
snapshot, then publishes each event on its local handle and calls the scheduling listeners
(which only enqueue). When the connection ends (the core died, or shutdown) every request in
flight gets Failed(EngineUnavailable), `healthy` turns false and later submits are refused.
"""
from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from multiprocessing.connection import Client

from ninfer_jax.engine.core_channel import (
    Batch, Control, Hello, Relayed, Submit, SubmitReply, hang_up,
)
from ninfer_jax.engine.lifecycle import SchedulingEvent
from ninfer_jax.engine.request import TERMINAL, Failed, GenerationRequest, RequestHandle
from ninfer_jax.engine.stats import EngineStats
from ninfer_jax.errors import EngineUnavailable

log = logging.getLogger("ninfer_jax.engine")


class _Pending:
    """A submit waiting for the core's SubmitReply."""

    def __init__(self):
        self.done = threading.Event()
        self.error = None


class EngineClient:
    def __init__(self, address: str, authkey: bytes):
        self._conn = Client(address, family="AF_UNIX", authkey=authkey)
        self._send_lock = threading.Lock()  # a Connection is not safe for concurrent sends
        self._lock = threading.Lock()  # _handles, _pending, _alive
        self._handles: dict[int, RequestHandle] = {}
        self._pending: dict[int, _Pending] = {}
        self._keys = itertools.count()
        self._listeners: list = []
        self._stats = EngineStats.empty()
        self._alive = True
        self._lost_reason = "the engine core stopped; the server must restart"
        self._built = threading.Event()  # Hello received, or the connection ended
        self.ready = threading.Event()  # the core's warm-up finished
        self.config = None  # EngineConfig, from Hello
        self.pool_tokens = 0
        self.runtime: dict = {}  # the core's JAX version, backend, devices
        self._thread = threading.Thread(target=self._receive_forever,
                                        name="ninfer-core-client", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ Engine's surface

    @property
    def healthy(self) -> bool:
        return self._alive and self._stats.healthy

    def stats(self) -> EngineStats:
        return self._stats

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self.ready.wait(timeout)

    def wait_built(self, timeout: float | None = None) -> None:
        """Until the core has built its engine (warm-up may still run). Raises
        EngineUnavailable if the core went away first, TimeoutError after `timeout`."""
        if not self._built.wait(timeout):
            raise TimeoutError("the engine core did not build its engine in time")
        if self.config is None:
            raise EngineUnavailable(self._lost_reason)

    def add_scheduling_listener(self, listener) -> None:
        """`listener(SchedulingEvent)` runs on the receiver thread: it must only enqueue."""
        self._listeners.append(listener)

    def submit(self, request: GenerationRequest) -> RequestHandle:
        key = next(self._keys)
        handle = RequestHandle(request, on_control=functools.partial(self._send_control, key))
        pending = _Pending()
        with self._lock:
            if not self._alive:
                raise EngineUnavailable(self._lost_reason)
            self._handles[key] = handle
            self._pending[key] = pending
        try:
            self._send(Submit(key, request))
        except BaseException:
            self._forget(key)
            raise
        pending.done.wait()
        if pending.error is not None:
            self._forget(key)
            raise pending.error
        return handle

    def shutdown(self, timeout: float | None = 5.0) -> None:
        """Leave the core (it cancels this worker's requests); local handles get Failed."""
        self._lost_reason = "the server is shutting down"
        hang_up(self._conn)  # the receiver sees the end and fails what is left
        self._thread.join(timeout)

    # ------------------------------------------------------------------ HTTP threads

    def _send(self, message) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, ValueError):
            raise EngineUnavailable(self._lost_reason) from None

    def _send_control(self, key: int, handle: RequestHandle) -> None:
        try:
            self._send(Control(key, handle.cancel_requested, handle.stop_requested_at))
        except EngineUnavailable:
            pass  # the handle has failed (or is about to): nothing left to stop

    def _forget(self, key: int) -> None:
        with self._lock:
            self._handles.pop(key, None)
            self._pending.pop(key, None)

    # ------------------------------------------------------------------ receiver thread

    def _receive_forever(self) -> None:
        try:
            while True:
                self._apply(self._conn.recv())
        except (EOFError, OSError):
            pass
        except Exception:  # noqa: BLE001 - a broken stream is a lost core, not a hang
            log.exception("engine-core channel failed")
        self._conn.close()
        self._lost()

    def _apply(self, batch: Batch) -> None:
        if batch.stats is not None:
            self._stats = batch.stats  # first: a woken HTTP thread sees stats this fresh
        for item in batch.items:
            if isinstance(item, Relayed):
                self._deliver(item)
            elif isinstance(item, SubmitReply):
                with self._lock:
                    pending = self._pending.pop(item.key, None)
                if pending is not None:
                    pending.error = item.error
                    pending.done.set()
            elif isinstance(item, SchedulingEvent):
                for listener in self._listeners:
                    listener(item)
            elif isinstance(item, Hello):
                self.config, self.pool_tokens = item.config, item.pool_tokens
                self.runtime = item.runtime
                self._built.set()
        if self._stats.ready and self.config is not None:
            self.ready.set()

    def _deliver(self, item: Relayed) -> None:
        if isinstance(item.event, TERMINAL):
            with self._lock:
                handle = self._handles.pop(item.key, None)
            policy = handle.request.token_policy if handle is not None else None
            if item.policy_outcome is not None and hasattr(policy, "adopt_outcome"):
                policy.adopt_outcome(item.policy_outcome)
        else:
            handle = self._handles.get(item.key)
        if handle is not None:
            handle.publish(item.event)

    def _lost(self) -> None:
        with self._lock:
            was_alive, self._alive = self._alive, False
            handles, self._handles = self._handles, {}
            pending, self._pending = self._pending, {}
        if was_alive and self._lost_reason != "the server is shutting down":
            log.error("the engine core went away: every request in flight fails")
        error = EngineUnavailable(self._lost_reason)
        for waiter in pending.values():
            waiter.error = error
            waiter.done.set()
        for handle in handles.values():
            handle.publish(Failed(error, time.monotonic()))
        self._built.set()
