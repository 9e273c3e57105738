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

Eviction works on leaves (nodes without cached children), least recently used first, so
chains shrink from their tails and shared beginnings survive longest; a leaf some sequence
still holds is skipped. Leaves sit in a heap by last use (stale entries are skipped when
popped), so reclaiming costs O(log n) per page, not O(cache size): the cache may hold most
of a large pool. `on_remove(node_id)` is told of every node that leaves (hybrid models drop
the node's state checkpoint then, engine/state_checkpoints.py).
Engine thread only.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools

from ninfer_jax.engine.pages import PagePool

ROOT = 0  # the parent id of a sequence's first page


@dataclasses.dataclass(eq=False)
class _Node:
    node_id: int
    key: tuple  # (parent node id, tokens of the page)
    page: int
    last_used: int  # a tick of the cache's clock
    num_children: int = 0


class PrefixCache:
    def __init__(self, pool: PagePool, page_size: int):
        self.pool = pool
        self.page_size = page_size
        self._nodes: dict[tuple, _Node] = {}
        self._by_id: dict[int, _Node] = {}
        # (last_used, node_id) of leaves; entries go stale when a node is used again, gains a
        # child or leaves the cache, and are skipped then.
        self._leaf_heap: list[tuple[int, int]] = []
        self._ids = itertools.count(ROOT + 1)
        self._ticks = itertools.count()
        self.on_remove = None  # called with the id of every node that leaves the cache

    @property
    def num_pages(self) -> int:
        return len(self._nodes)

    def pages(self) -> list[int]:
        return [node.page for node in self._nodes.values()]

    def _key(self, tokens, index: int, parent: int) -> tuple:
        return (parent, tuple(tokens[index * self.page_size:(index + 1) * self.page_size]))

    def count_cached(self, tokens, max_pages: int) -> tuple[int, int]:
        """(leading pages of `tokens` cached, how many of those only the cache holds);
        no reference taken, LRU order untouched."""
        parent, cache_only = ROOT, 0
        for index in range(max_pages):
            node = self._nodes.get(self._key(tokens, index, parent))
            if node is None:
                return index, cache_only
            cache_only += self.pool.refcount(node.page) == 1
            parent = node.node_id
        return max_pages, cache_only

    def chain(self, tokens, max_pages: int) -> list[int]:
        """Node ids of the longest cached prefix of `tokens` (at most `max_pages`); no
        reference taken, LRU order untouched."""
        ids, parent = [], ROOT
        for index in range(max_pages):
            node = self._nodes.get(self._key(tokens, index, parent))
            if node is None:
                break
            ids.append(node.node_id)
            parent = node.node_id
        return ids

    def match(self, tokens, max_pages: int) -> tuple[list[int], int]:
        """The pages holding the longest cached prefix of `tokens` (at most `max_pages`),
        each with a new reference for the caller, and the id of the last matched node."""
        pages, parent = [], ROOT
        for index in range(max_pages):
            node = self._nodes.get(self._key(tokens, index, parent))
            if node is None:
                break
            self._touch(node)
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
            key = self._key(tokens, index, parent)
            node = self._nodes.get(key)
            if node is None:
                node = self._add(key, pages[index])
            else:
                self._touch(node)
                if node.page != pages[index] and self.pool.refcount(node.page) == 1:
                    # An identical page nobody else holds: keep the live one, free the copy.
                    self.pool.share(pages[index])
                    self.pool.release([node.page])
                    node.page = pages[index]
            parent = node.node_id
            num_done = index + 1
        return num_done, parent

    def reclaim(self, num_pages: int) -> int:
        """Evict least recently used leaves only the cache holds until `num_pages` pages are
        free (or none is left); returns how many pages became free."""
        freed_before, held = self.pool.num_free, []
        while self.pool.num_free < num_pages and self._leaf_heap:
            entry = heapq.heappop(self._leaf_heap)
            node = self._by_id.get(entry[1])
            if node is None or node.num_children or node.last_used != entry[0]:
                continue  # stale
            if self.pool.refcount(node.page) > 1:
                held.append(entry)  # a sequence still reads it: keep it for later
                continue
            self._remove(node)
        for entry in held:
            heapq.heappush(self._leaf_heap, entry)
        return self.pool.num_free - freed_before

    def clear(self) -> None:
        """Drop every node, releasing the cache's references."""
        self.pool.release([node.page for node in self._nodes.values()])
        if self.on_remove is not None:
            for node_id in self._by_id:
                self.on_remove(node_id)
        self._nodes.clear()
        self._by_id.clear()
        self._leaf_heap.clear()

    # ------------------------------------------------------------------ tree upkeep

    def _add(self, key: tuple, page: int) -> _Node:
        node = _Node(next(self._ids), key, page, next(self._ticks))
        self.pool.share(page)
        self._nodes[key] = node
        self._by_id[node.node_id] = node
        self._push_leaf(node)
        parent = self._by_id.get(key[0])
        if parent is not None:
            parent.num_children += 1  # its heap entries are stale from now on
        return node

    def _touch(self, node: _Node) -> None:
        node.last_used = next(self._ticks)
        if not node.num_children:
            self._push_leaf(node)

    def _push_leaf(self, node: _Node) -> None:
        heapq.heappush(self._leaf_heap, (node.last_used, node.node_id))
        if len(self._leaf_heap) > 2 * len(self._nodes) + 64:  # drop the stale entries
            self._leaf_heap = [(n.last_used, n.node_id) for n in self._nodes.values()
                               if not n.num_children]
            heapq.heapify(self._leaf_heap)

    def _remove(self, leaf: _Node) -> None:
        del self._nodes[leaf.key]
        del self._by_id[leaf.node_id]
        self.pool.release([leaf.page])
        if self.on_remove is not None:
            self.on_remove(leaf.node_id)
        parent = self._by_id.get(leaf.key[0])
        if parent is not None:
            parent.num_children -= 1
            if not parent.num_children:
                self._push_leaf(parent)  # ranked by its own last use
