"""HostPagePool: the host tier's page slots (--host-context-mib), and the queue of page copies.

The host tier holds copies of device KV pages in host memory: prefix-cache pages evicted from
the device pool (prefix_cache.py spills them instead of dropping them) and the pages of paused
requests (snapshots, scheduler.py). Both draw on this one pool of `capacity` slots, each the
size of one device page; the runner owns the bytes (pinned host memory on a GPU, plain RAM on
the CPU) and this pool only which slot is free.

Copies are device work, so they ride in the next StepPlan (`page_copies`) as an ordered list
of `PageCopy`: the runner applies them in order before the step. Order is the whole
correctness argument: a save reads a device page before any later step (or load) can
overwrite it, and a host slot freed after a queued load (or drop) may be saved into again
only by a copy queued after it. A load leaves the slot's bytes in place: the holder keeps
them as a clean copy of the page it loaded (prefix_cache.py) or releases the slot.
Engine thread only.
"""
from __future__ import annotations

import collections
from typing import NamedTuple

SAVE, LOAD, DROP = "save", "load", "drop"


class PageCopy(NamedTuple):
    # SAVE: device page -> host slot; LOAD: host slot -> device page (the slot keeps its
    # bytes); DROP: the slot is free (device_page unused): the runner forgets its bytes.
    kind: str
    device_page: int
    host_slot: int


class StateCopy(NamedTuple):
    """A hybrid state to or from the host tier (a pause snapshot, a spilled state
    checkpoint). It rides in StepPlan.state_copies, in order with the state-slot copies
    there, because both read and write state slots. The bytes are one row the runner keeps
    under `ticket`, apart from page rows; the budget for it is `state_units` slots held by
    `reserve`."""
    kind: str  # SAVE: state slot -> row; LOAD: row -> state slot (the row stays); DROP
    state_slot: int  # unused by DROP
    ticket: int


class HostPagePool:
    def __init__(self, capacity: int, page_bytes: int = 0, state_bytes: int = 0):
        if capacity < 0:
            raise ValueError("a host pool cannot have a negative capacity")
        self.capacity = capacity
        self.page_bytes = page_bytes  # for the byte gauges only
        # Slots one state snapshot takes from the budget (0: no state, or no host tier).
        self.state_units = -(-state_bytes // page_bytes) if state_bytes and page_bytes else 0
        # Slots below `_fresh` have been handed out at least once; `_released` holds those
        # free again (a budget of GiBs is millions of slots: no list of them up front).
        self._fresh = 0
        self._released: collections.deque[int] = collections.deque()
        self.peak_used = 0
        self.copies: list[PageCopy] = []  # queued since the last plan, in order
        self.bytes_saved = 0  # cumulative device -> host
        self.bytes_loaded = 0  # cumulative host -> device

    @property
    def is_enabled(self) -> bool:
        return self.capacity > 0

    @property
    def num_free(self) -> int:
        return self.capacity - self._fresh + len(self._released)

    @property
    def num_used(self) -> int:
        return self._fresh - len(self._released)

    def save(self, device_page: int) -> int:
        """Queue a copy of `device_page` into a fresh slot; the caller checked num_free."""
        slot = self._take()
        self.copies.append(PageCopy(SAVE, device_page, slot))
        self.bytes_saved += self.page_bytes
        return slot

    def reserve(self, count: int) -> list[int]:
        """`count` slots held with no page copy: a state snapshot's room in the budget."""
        return [self._take() for _ in range(count)]

    def unreserve(self, slots) -> None:
        for slot in slots:
            self._free(slot)

    def _take(self) -> int:
        if self._released:
            # The slot freed longest ago: one a load just freed is reused last, so a save
            # rarely waits on that load (page_store.waves batches independent copies).
            slot = self._released.popleft()
        elif self._fresh < self.capacity:
            slot, self._fresh = self._fresh, self._fresh + 1
        else:
            raise ValueError("the host tier is full (the caller checks num_free)")
        self.peak_used = max(self.peak_used, self.num_used)
        return slot

    def load(self, slot: int, device_page: int) -> None:
        """Queue a copy of `slot` into `device_page`; the slot stays held (release it when
        its bytes are not worth keeping: a later save into it is queued after the load)."""
        self.copies.append(PageCopy(LOAD, device_page, slot))
        self.bytes_loaded += self.page_bytes

    def release(self, slot: int) -> None:
        """Free `slot` without loading it; the runner drops its bytes in order."""
        self._free(slot)
        self.copies.append(PageCopy(DROP, -1, slot))

    def _free(self, slot: int) -> None:
        if not 0 <= slot < self._fresh:
            raise ValueError(f"release of host slot {slot}, which is not held")
        self._released.append(slot)

    def pop_copies(self) -> tuple[PageCopy, ...]:
        copies, self.copies = tuple(self.copies), []
        return copies

    def check(self, holders) -> None:
        """Raise AssertionError unless the held slots are exactly `holders` (each once)."""
        held, free = list(holders), set(self._released)
        if len(set(held)) != len(held) or len(free) != len(self._released):
            raise AssertionError("a host slot has two holders or is free twice")
        if set(held) | free != set(range(self._fresh)) or set(held) & free:
            raise AssertionError("host slots leaked or held while free")
