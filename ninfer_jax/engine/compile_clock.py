"""CompileClock: the XLA compiles each thread has waited for, from JAX's monitoring events.

The step loop reads the engine thread's count around every launch: a compile there (a jitted
helper meeting a shape warm-up did not compile) stalls every stream, and nothing else names
it (run 41's CPU server: a host-tier save of a new run length compiled for 0.39 s inside a
launch). A load from JAX's persistent compilation cache (JAX_COMPILATION_CACHE_DIR, set by
`make`) stands in for the compile it saves and counts the same: JAX's event spans both. The
JaxRunner installs it when it is built: the listener imports jax, which the
engine-core process must not do before its environment (XLA_FLAGS) is applied, and a fake
runner's engine never needs it.
"""
from __future__ import annotations

import threading

# JAX times compile_or_get_cached under this name: a compile, or a persistent-cache load
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileClock:
    def __init__(self):
        self._totals: dict[int, tuple[int, float]] = {}  # thread ident -> (compiles, seconds)
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            from jax import monitoring

            monitoring.register_event_duration_secs_listener(self._on_event)
            self._installed = True

    def _on_event(self, event: str, duration: float, **_) -> None:
        if event == BACKEND_COMPILE_EVENT:  # reported in the thread that compiled
            ident = threading.get_ident()
            count, seconds = self._totals.get(ident, (0, 0.0))
            self._totals[ident] = (count + 1, seconds + duration)

    def here(self) -> tuple[int, float]:
        """(compiles, seconds) of the calling thread so far."""
        return self._totals.get(threading.get_ident(), (0, 0.0))


COMPILE_CLOCK = CompileClock()
