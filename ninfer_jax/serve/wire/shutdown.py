"""What a stopping HTTP worker does with the requests it still serves.

On SIGTERM or SIGINT the worker (serve/wire/http_worker.py) stops accepting and closes its
listening sockets, so new clients are refused at once rather than left in a backlog; the
requests in flight may finish for `--shutdown-timeout` seconds. Whatever still runs then is
ended by `InFlight.abort_all`: each request is cancelled in the engine and its reply gets a
terminal error (EngineUnavailable, "the server is shutting down"): a 503 body for a
request that has not answered yet, an error event for an open stream. Its HTTP thread then
ends normally, so the request log gets the request's end record before the worker closes
the log (launcher's worker_exit hook).

Thread-safe: handles are added on HTTP threads, aborted from the worker's event loop.
"""
from __future__ import annotations

import threading
import time
import weakref

from ninfer_jax.engine.request import Failed
from ninfer_jax.errors import EngineUnavailable


class InFlight:
    """Every request handle this worker submitted and has not yet let go of (weakly held: a
    finished request leaves by itself)."""

    def __init__(self):
        self._handles: "weakref.WeakSet" = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, handle) -> None:
        with self._lock:
            self._handles.add(handle)

    def abort_all(self) -> int:
        """End every request still running with a shutdown error; the number visited."""
        with self._lock:
            handles = list(self._handles)
        error = EngineUnavailable("The server is shutting down; the request was ended "
                                  "before it finished.", code="server_shutting_down")
        for handle in handles:
            handle.cancel()
            # A no-op for a handle that already got its terminal event.
            handle.publish(Failed(error, time.monotonic()))
        return len(handles)
