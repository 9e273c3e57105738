"""PrefixCache: full KV pages kept and shared across requests with identical token prefixes.

A node stands for one full page of KV: its key is (parent node id, the page's tokens), so a
chain of nodes from the root spells a token prefix exactly (no hashing shortcuts, no false
hits). The cache holds one pool reference per node's page; sequences that reuse a node take
their own reference (PagePool.share), so a page is free only when neither needs it.

Reused pages are read-only by construction: a sequence reuses whole pages only and starts
computing at the first position after them, so no copy-on-write is ever needed.

When a sequence computes a page the cache already has (it ran alongside the first one, or
the cached copy was dropped from its table by a pause), the cache keeps the sequence's page
and frees its own copy if nobody else holds it, so duplicates do not linger.

Pages that only the cache holds (refcount 1) are reclaimable: under pressure the scheduler
evicts them, least recently used first, before it pauses any request. A paused request's
pages stay here until evicted, so its restore often finds most of them and replays little.
Engine thread only.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools

from ninfer_jax.engine.pages import PagePool

ROOT = 0  # the parent id of a sequence's first page


@dataclasses.dataclass(eq=False)
class _Node:
    node_id: int
    key: tuple  # (parent node id, tokens of the page)
    page: int
    children: set = dataclasses.field(default_factory=set)  # child keys


class PrefixCache:
    def __init__(self, pool: PagePool, page_size: int):
        self.pool = pool
        self.page_size = page_size
        self._nodes: collections.OrderedDict[tuple, _Node] = collections.OrderedDict()  # LRU
        self._by_id: dict[int, _Node] = {}
        self._ids = itertools.count(ROOT + 1)

    @property
    def num_pages(self) -> int:
        return len(self._nodes)

    def pages(self) -> list[int]:
        return [node.page for node in self._nodes.values()]

    def num_reclaimable(self) -> int:
        """Pages reclaim() could free: nodes that no sequence holds and that lead to no held
        node (a held page pins its whole path from the root)."""
        pinned: set[int] = set()
        for node in self._nodes.values():
            current = node if self.pool.refcount(node.page) > 1 else None
            while current is not None and current.node_id not in pinned:
                pinned.add(current.node_id)
                current = self._by_id.get(current.key[0])
        return len(self._nodes) - len(pinned)

    def count_cached(self, tokens, max_pages: int) -> tuple[int, int]:
        """(leading pages of `tokens` cached, how many of those only the cache holds);
        no reference taken, LRU order untouched."""
        parent, reclaimable = ROOT, 0
        for index in range(max_pages):
            key = (parent, tuple(tokens[index * self.page_size:(index + 1) * self.page_size]))
            node = self._nodes.get(key)
            if node is None:
                return index, reclaimable
            reclaimable += self.pool.refcount(node.page) == 1
            parent = node.node_id
        return max_pages, reclaimable

    def match(self, tokens, max_pages: int) -> tuple[list[int], int]:
        """The pages holding the longest cached prefix of `tokens` (at most `max_pages`),
        each with a new reference for the caller, and the id of the last matched node."""
        pages, parent = [], ROOT
        for index in range(max_pages):
            key = (parent, tuple(tokens[index * self.page_size:(index + 1) * self.page_size]))
            node = self._nodes.get(key)
            if node is None:
                break
            self._nodes.move_to_end(key)
            self.pool.share(node.page)
            pages.append(node.page)
            parent = node.node_id
        return pages, parent

    def publish(self, tokens, pages: list[int], num_computed: int,
                cursor: tuple[int, int]) -> tuple[int, int]:
        """Record the full pages of a sequence whose KV is computed. `cursor` = (pages
        already recorded, last node id) from the previous call; returns the new cursor."""
        num_done, parent = cursor
        for index in range(num_done, num_computed // self.page_size):
            key = (parent, tuple(tokens[index * self.page_size:(index + 1) * self.page_size]))
            node = self._nodes.get(key)
            if node is None:
                node = _Node(next(self._ids), key, pages[index])
                self.pool.share(node.page)
                self._nodes[key] = node
                self._by_id[node.node_id] = node
                parent_node = self._by_id.get(parent)
                if parent_node is not None:
                    parent_node.children.add(key)
            else:
                self._nodes.move_to_end(key)
                if node.page != pages[index] and self.pool.refcount(node.page) == 1:
                    # An identical page nobody else holds: keep the live one, free the copy.
                    self.pool.share(pages[index])
                    self.pool.release([node.page])
                    node.page = pages[index]
            parent = node.node_id
            num_done = index + 1
        return num_done, parent

    def reclaim(self, num_pages: int) -> int:
        """Evict pages only the cache holds until `num_pages` pages are free (or nothing
        reclaimable is left); returns how many pages became free. Chains shrink from their
        tails (least recently used leaf first), so the shared beginnings survive longest."""
        freed_before = self.pool.num_free
        while self.pool.num_free < num_pages:
            victim = next((n for n in self._nodes.values()
                           if not n.children and self.pool.refcount(n.page) == 1), None)
            if victim is None:
                break
            self._evict(victim)
        return self.pool.num_free - freed_before

    def clear(self) -> None:
        while self._nodes:
            self._evict(next(iter(self._nodes.values())))

    def _evict(self, node: _Node) -> None:
        """Drop a node and everything cached below it (unreachable without it)."""
        parent_node = self._by_id.get(node.key[0])
        if parent_node is not None:
            parent_node.children.discard(node.key)
        stack = [node]
        while stack:  # iterative: chains are as deep as the context is long
            current = stack.pop()
            stack.extend(self._nodes[key] for key in current.children)
            del self._nodes[current.key]
            del self._by_id[current.node_id]
            self.pool.release([current.page])
