"""Prepared media payloads: an LRU cache with a live-memory account and single-flight builds.

Keyed by (SHA-256 of the acquired bytes, modality). An entry is *retained* while the LRU
holds it (their bytes bounded by --media-cache-mib) and *referenced* while a lease holds
it; it is *live* while either is true, and every live byte counts against --media-live-mib.
Evicting an entry from the LRU never invalidates a lease: its bytes stay live until the last
lease is released. A miss that another thread is already building waits for that build
(one build per key at a time). A new payload that would push the live bytes past the limit,
after evicting unreferenced entries, is refused with MediaBudgetExceeded.
Thread-safe: one lock guards the maps and counters; builds run outside it.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
from concurrent.futures import Future
from typing import Callable

from ninfer_jax.errors import MediaBudgetExceeded

Key = tuple[str, str]  # (sha256 hex digest, "image" | "video")


@dataclasses.dataclass
class _Entry:
    payload: object  # anything with `nbytes`
    refs: int = 0
    retained: bool = False

    @property
    def nbytes(self) -> int:
        return self.payload.nbytes


class Lease:
    """One reference to a live payload; `release()` is idempotent."""

    def __init__(self, cache: "PayloadCache", key: Key, entry: _Entry, outcome: str):
        self.payload = entry.payload
        self.outcome = outcome  # "hit" | "miss" | "joined" (waited for another build)
        self._cache, self._key, self._entry = cache, key, entry
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._cache._release(self._key, self._entry)


class PayloadCache:
    def __init__(self, cache_bytes: int, live_bytes: int):
        self.cache_bytes = cache_bytes
        self.live_bytes = live_bytes
        self._lock = threading.Lock()
        self._lru: collections.OrderedDict[Key, _Entry] = collections.OrderedDict()
        self._live: dict[Key, _Entry] = {}  # every live entry (retained or referenced)
        self._building: dict[Key, Future] = {}
        self.stats = collections.Counter()  # hits, misses, joined, evictions, refusals

    # ------------------------------------------------------------------ reading

    @property
    def retained_bytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._lru.values())

    @property
    def live_bytes_used(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._live.values())

    # ------------------------------------------------------------------ leasing

    def lease(self, key: Key, build: Callable[[], Future]) -> Lease:
        """The payload for `key`, built by `build()` (a Future) on a miss. Raises what the
        build raised, or MediaBudgetExceeded when the payload cannot be made live."""
        return self.begin(key, build)()

    def begin(self, key: Key, build: Callable[[], Future]) -> Callable[[], Lease]:
        """`lease` in two halves: start the build now (so several can run at once), and
        return the function that waits for it and takes the lease."""
        with self._lock:
            entry = self._live.get(key)
            if entry is not None:
                if entry.retained:
                    self._lru.move_to_end(key)
                self.stats["hits"] += 1
                lease = self._ref(key, entry, "hit")
                return lambda: lease
            future = self._building.get(key)
            owner = future is None
            if owner:
                future = self._building[key] = build()
        return lambda: self._finish(key, future, owner)

    def _finish(self, key: Key, future: Future, owner: bool) -> Lease:
        try:
            payload = future.result()
        finally:
            if owner:
                with self._lock:
                    self._building.pop(key, None)
        with self._lock:
            entry = self._live.get(key) or _Entry(payload)
            self.stats["misses" if owner else "joined"] += 1
            return self._ref(key, entry, "miss" if owner else "joined")

    def _ref(self, key: Key, entry: _Entry, outcome: str) -> Lease:
        if key not in self._live:
            self._make_room(entry.nbytes)
            self._live[key] = entry
            if 0 < entry.nbytes <= self.cache_bytes:
                entry.retained = True
                self._lru[key] = entry
                self._trim()
        entry.refs += 1
        return Lease(self, key, entry, outcome)

    def _make_room(self, nbytes: int) -> None:
        used = sum(e.nbytes for e in self._live.values())
        for key in list(self._lru):
            if used + nbytes <= self.live_bytes:
                break
            entry = self._lru[key]
            if entry.refs == 0:
                self._evict(key, entry)
                used -= entry.nbytes
        if used + nbytes > self.live_bytes:
            self.stats["refusals"] += 1
            raise MediaBudgetExceeded(
                f"prepared media needs {nbytes} bytes, but {used} of the server's "
                f"{self.live_bytes} bytes of live media payloads (--media-live-mib) are in use")

    def _trim(self) -> None:
        retained = sum(e.nbytes for e in self._lru.values())
        while retained > self.cache_bytes and self._lru:
            key, entry = next(iter(self._lru.items()))
            retained -= entry.nbytes
            self._evict(key, entry)

    def _evict(self, key: Key, entry: _Entry) -> None:
        del self._lru[key]
        entry.retained = False
        self.stats["evictions"] += 1
        if entry.refs == 0:
            self._live.pop(key, None)

    def _release(self, key: Key, entry: _Entry) -> None:
        with self._lock:
            entry.refs -= 1
            if entry.refs == 0 and not entry.retained:
                self._live.pop(key, None)
