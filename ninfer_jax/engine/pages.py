"""PagePool: ownership of the KV cache pages, with reference counts.

Pages are numbered 0..P-1. Page DUMMY_PAGE (0) belongs to nobody: padding rows write there
and padded page-table entries point there (see kernels/paged_attention), so it is never in
the free list and never handed out. A live page has refcount >= 1: one count per sequence
whose page table holds it, plus one when the prefix cache retains it, so a page shared by
several requests returns to the free list only when its last holder lets go.

Only the engine thread touches a pool; it has no locks.
"""
from __future__ import annotations

from typing import Iterable

from ninfer_jax.engine.numbered_pool import NumberedPool

# The page every padding row writes to and every padded page-table entry names. It must equal
# kernels.paged_attention.DUMMY_PAGE (a test checks); defined here so the host-side engine
# never imports JAX.
DUMMY_PAGE = 0


class PoolExhausted(RuntimeError):
    """alloc() asked for more pages than are free (the scheduler checks first)."""


def pages_for(num_positions: int, page_size: int) -> int:
    """Pages needed to hold KV for positions [0, num_positions)."""
    return -(-num_positions // page_size)


class PagePool(NumberedPool):
    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError("a pool needs the dummy page plus at least one usable page")
        super().__init__(num_pages - 1)
        self.num_pages = num_pages
        self._refs = [0] * num_pages

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def alloc(self, count: int) -> list[int]:
        """`count` fresh pages, each with refcount 1."""
        if count > len(self._free):
            raise PoolExhausted(f"asked for {count} pages, {len(self._free)} free")
        pages = [self._free.popleft() for _ in range(count)]
        for page in pages:
            self._refs[page] = 1
        return pages

    def share(self, page: int) -> None:
        """One more holder for a live page (prefix reuse)."""
        if page == DUMMY_PAGE or self._refs[page] < 1:
            raise ValueError(f"page {page} is not live")
        self._refs[page] += 1

    def release(self, pages: Iterable[int]) -> None:
        """Drop one reference per listed page; pages nobody holds become free."""
        for page in pages:
            if page == DUMMY_PAGE or self._refs[page] < 1:
                raise ValueError(f"release of page {page}, which is not live")
            self._refs[page] -= 1
            if self._refs[page] == 0:
                self._free.append(page)

    def check(self, holders: Iterable[Iterable[int]]) -> None:
        """Raise AssertionError unless the refcounts are exactly the holders' references:
        no leaked page, no page both free and held, the dummy page untouched."""
        expected = [0] * self.num_pages
        for pages in holders:
            for page in pages:
                expected[page] += 1
        free = set(self._free)
        problems = []
        if len(free) != len(self._free):
            problems.append("a page appears twice in the free list")
        if DUMMY_PAGE in free or expected[DUMMY_PAGE] or self._refs[DUMMY_PAGE]:
            problems.append("the dummy page was handed out")
        for page in range(self.num_pages):
            if page == DUMMY_PAGE:
                continue
            if expected[page] != self._refs[page]:
                problems.append(f"page {page}: refcount {self._refs[page]}, "
                                f"{expected[page]} holders")
            if (page in free) != (self._refs[page] == 0):
                problems.append(f"page {page}: free-list membership disagrees with refcount")
        if problems:
            raise AssertionError("; ".join(problems[:8]))
