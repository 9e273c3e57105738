"""NumberedPool: the free list that page and state-slot pools share.

Entries are numbered 0..capacity. Entry 0 is each pool's dummy (DUMMY_PAGE, DUMMY_STATE_SLOT):
padding reads and writes it, so it is never in the free list and never handed out. Reuse is
FIFO: a freed entry goes to the back, so stale contents stay unread longest.
"""
from __future__ import annotations

import collections


class NumberedPool:
    def __init__(self, capacity: int):
        self.capacity = capacity  # usable entries, the dummy excluded
        self._free = collections.deque(range(1, capacity + 1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.capacity - len(self._free)
