"""PrefixCache: full KV pages kept and shared across requests with identical token prefixes,
on the device and, past the device pool, in the host tier.

A node stands for one full page of KV: its key is (parent node id, the page's tokens), so a
chain of nodes from the root spells a token prefix exactly (no hashing shortcuts, no false
hits). A node's KV lives in a device page (the cache holds one pool reference; sequences that
reuse it take their own, PagePool.share), in a host slot (host_pages.py), or in both: a
*clean* node's host slot holds a copy of its device page. Device nodes are prefix-closed: a
node on the device has its parent on the device, because evictions take device leaves (no
child on the device) and loads walk from the root.

Write-through: a newly published page is saved to the host tier at once (the save rides with
the step after the one that computed it, so it overlaps that step instead of delaying one
that needs the page), so evicting it later moves no bytes: the device page is simply freed
and the host slot becomes its only home. A hit loads a host page back and keeps the slot as
the clean copy, so evicting it again is free too. A write-through takes a free slot, or the
slot of a host-only leaf (one that ranks no higher) while clean copies hold fewer than
`clean_limit` slots: the host tier's slots beyond the device pool's size, at most the device
pool's size. So on a host tier twice the device pool every device page can have its copy,
and host-only pages always keep a device pool's worth of slots; a host tier smaller than the
device pool takes copies into free slots only (the device evicts pages far older than the
ones just published: their copies would be displaced long before they could save a copy).
Room for a page that has no other copy (a spill, a snapshot) is made by dropping clean
copies first (they lose nothing; the most recently used page's first, since its device page
is the last to be evicted), then host-only leaves, lowest rank first.

Reused pages are read-only by construction: a sequence reuses whole pages only and starts
computing at the first position after them, so no copy-on-write is ever needed.

When a sequence computes a page the cache already has (it ran alongside the first one, or
the cached copy was dropped from its table by a pause, or it is on the host only), the cache
adopts the sequence's page and frees its own copy if nobody else holds it; when another
sequence holds the cache's copy, the publishing sequence switches to it (`publish` replaces
the entry in its page list) and frees its duplicate. Either way one copy stays: a duplicate
kept by the sequence would leave the cache's copy, once its other holder ends, pinned under
the sequence's later pages (prefix-closed, so never evicted) for as long as it runs.

Eviction ranks by (keep, last use): pages inside a request's explicit cache breakpoint have
keep 1 and go only after every keep-0 page, least recently used first within a rank. The
device pool evicts leaves (so chains shrink from their tails and shared beginnings survive);
with a host tier an evicted page without a clean copy is spilled (a queued save) instead of
dropped, and the host tier in turn drops its own leaves, never one ranked above the page it
makes room for. A hit on a host node loads it back into a fresh device page (a queued load).
Leaves and clean nodes sit in heaps by rank (stale entries are skipped when popped), so
reclaiming costs O(log n) per page.
`on_remove(node_id)` is told of every node that leaves the tree (hybrid models drop the
node's state checkpoint then, from the device or the host tier, engine/state_checkpoints.py,
whose host rows take their room through `free_host_for`). Engine thread only.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools

from ninfer_jax.engine.host_pages import HostPagePool
from ninfer_jax.engine.pages import PagePool

ROOT = 0  # the parent id of a sequence's first page


@dataclasses.dataclass(eq=False)
class _Node:
    node_id: int
    key: tuple  # (parent node id, tokens of the page)
    page: int | None  # device page; None while the page lives in the host tier only
    last_used: int  # a tick of the cache's clock
    host_slot: int | None = None  # with `page` set: a clean copy of it
    keep: int = 0  # 1: within an explicit cache breakpoint, evicted after every 0
    children: set = dataclasses.field(default_factory=set)  # node ids
    num_device_children: int = 0

    @property
    def rank(self) -> tuple[int, int, int]:
        return (self.keep, self.last_used, self.node_id)

    @property
    def is_clean(self) -> bool:
        return self.page is not None and self.host_slot is not None


class PrefixCache:
    def __init__(self, pool: PagePool, page_size: int, host: HostPagePool | None = None):
        self.pool = pool
        self.page_size = page_size
        self.host = host if host is not None and host.is_enabled else None
        self._nodes: dict[tuple, _Node] = {}
        self._by_id: dict[int, _Node] = {}
        # Ranks of device leaves and of host leaves; entries go stale when a node is used
        # again, changes rank or tier, gains a child or leaves, and are skipped then.
        self._device_heap: list[tuple[int, int, int]] = []
        self._host_heap: list[tuple[int, int, int]] = []
        # Clean nodes by negated rank: the copy dropped first is the most recently used
        # page's (its device page will be evicted last).
        self._clean_heap: list[tuple[int, int, int]] = []
        self._ids = itertools.count(ROOT + 1)
        self._ticks = itertools.count()
        self._num_device = 0
        self._num_clean = 0
        self.clean_limit = (min(pool.capacity, max(0, self.host.capacity - pool.capacity))
                            if self.host is not None else 0)
        self.on_remove = None  # called with the id of every node that leaves the cache
        self.spilled_pages = 0  # cumulative device -> host saves at eviction
        self.written_pages = 0  # cumulative write-through saves at publish
        self.free_evictions = 0  # cumulative evictions of clean pages (no copy)
        self.loaded_pages = 0  # cumulative host -> device loads on hits

    @property
    def num_pages(self) -> int:
        """Device pages the cache retains."""
        return self._num_device

    @property
    def num_host_pages(self) -> int:
        """Pages in the host tier only."""
        return len(self._nodes) - self._num_device

    @property
    def num_clean_pages(self) -> int:
        """Device pages with a copy in the host tier."""
        return self._num_clean

    def pages(self) -> list[int]:
        return [node.page for node in self._nodes.values() if node.page is not None]

    def host_slots(self) -> list[int]:
        return [node.host_slot for node in self._nodes.values() if node.host_slot is not None]

    def _key(self, tokens, index: int, parent: int) -> tuple:
        return (parent, tuple(tokens[index * self.page_size:(index + 1) * self.page_size]))

    def count_cached(self, tokens, max_pages: int) -> tuple[int, int]:
        """(leading pages of `tokens` cached on the device, how many of those only the cache
        holds); no reference taken, LRU order untouched. Host pages are not counted: each
        needs a device page of its own to come back."""
        parent, cache_only = ROOT, 0
        for index in range(max_pages):
            node = self._nodes.get(self._key(tokens, index, parent))
            if node is None or node.page is None:
                return index, cache_only
            cache_only += self.pool.refcount(node.page) == 1
            parent = node.node_id
        return max_pages, cache_only

    def chain(self, tokens, max_pages: int, *, host: bool = False) -> list[int]:
        """Node ids of the longest device-cached prefix of `tokens` (at most `max_pages`;
        with `host`, host-only nodes count too); no reference taken, LRU order untouched."""
        ids, parent = [], ROOT
        for index in range(max_pages):
            node = self._nodes.get(self._key(tokens, index, parent))
            if node is None or (node.page is None and not host):
                break
            ids.append(node.node_id)
            parent = node.node_id
        return ids

    def match(self, tokens, max_pages: int, *, load: bool = True) -> tuple[list[int], int]:
        """The pages holding the longest cached prefix of `tokens` (at most `max_pages`),
        each with a new reference for the caller, and the id of the last matched node.
        With `load`, spilled pages come back into fresh device pages (queued loads) while
        the device pool can give one."""
        if load and self.host is not None:
            self._room_for_loads(tokens, max_pages)
        pages, parent = [], ROOT
        for index in range(max_pages):
            node = self._nodes.get(self._key(tokens, index, parent))
            if node is None:
                break
            if node.page is None and not (load and self._load(node)):
                break
            self._touch(node)
            self.pool.share(node.page)
            pages.append(node.page)
            parent = node.node_id
        return pages, parent

    def publish(self, tokens, pages: list[int], num_computed: int,
                cursor: tuple[int, int], keep_pages: int = 0) -> tuple[int, int]:
        """Record the full pages of a sequence whose KV is computed, the first `keep_pages`
        of them ranked keep (an explicit breakpoint covers them). `cursor` = (pages already
        recorded, last node id) from the previous call; returns the new cursor. Where another
        sequence holds the cache's copy of a page, `pages[index]` becomes that copy (the
        caller's duplicate is released): callers pass a list they may have replaced."""
        num_done, parent = cursor
        for index in range(num_done, num_computed // self.page_size):
            key = self._key(tokens, index, parent)
            node = self._nodes.get(key)
            is_new = node is None
            if is_new:
                node = self._add(key, pages[index])
            else:
                pages[index] = self._adopt(node, pages[index])
                self._touch(node)
            if index < keep_pages and not node.keep:
                node.keep = 1
                self._requeue(node)
            if is_new:
                self._write_through(node)
            parent = node.node_id
            num_done = index + 1
        return num_done, parent

    def reclaim(self, num_pages: int, protect: frozenset = frozenset()) -> int:
        """Evict lowest-ranked device leaves only the cache holds (to the host tier when it
        has their clean copy or room for one) until `num_pages` pages are free (or none is
        left); returns how many became free. Nodes whose id is in `protect` (a match about
        to load them) stay in both tiers."""
        freed_before, held = self.pool.num_free, []
        while self.pool.num_free < num_pages and self._device_heap:
            entry = heapq.heappop(self._device_heap)
            node = self._by_id.get(entry[2])
            if (node is None or node.page is None or node.num_device_children
                    or node.rank != entry):
                continue  # stale
            if self.pool.refcount(node.page) > 1 or node.node_id in protect:
                held.append(entry)  # a sequence still reads it: keep it for later
                continue
            if node.host_slot is not None:
                self.free_evictions += 1
                self._to_host(node)
            elif self.host is not None and self._host_room(node.keep, protect):
                node.host_slot = self.host.save(node.page)
                self._num_clean += 1
                self.spilled_pages += 1
                self._to_host(node)
            else:
                self._remove_subtree(node)
        for entry in held:
            heapq.heappush(self._device_heap, entry)
        return self.pool.num_free - freed_before

    def free_host(self, num_slots: int) -> bool:
        """Drop clean copies, then host leaves lowest rank first, until `num_slots` host
        slots are free (a pause snapshot outranks retained history); False when that many
        cannot be freed."""
        while self.host.num_free < num_slots:
            if not (self._drop_clean_copy()
                    or self._drop_host_leaf(keep=1, protect=frozenset())):
                return False
        return True

    def free_host_for(self, num_slots: int, node_id: int) -> bool:
        """Room for `num_slots` host slots that belong to node `node_id` (a hybrid state
        checkpoint's row), made as for a spill of that node's page: clean copies first, then
        host leaves ranked no higher than it, never the node itself."""
        node = self._by_id[node_id]
        protect = frozenset((node_id,))
        while self.host.num_free < num_slots:
            if not (self._drop_clean_copy() or self._drop_host_leaf(node.keep, protect)):
                return False
        return True

    def clear(self) -> None:
        """Drop every node, releasing the cache's references and host slots."""
        self.pool.release(self.pages())
        for slot in self.host_slots():
            self.host.release(slot)
        if self.on_remove is not None:
            for node_id in self._by_id:
                self.on_remove(node_id)
        self._nodes.clear()
        self._by_id.clear()
        self._device_heap.clear()
        self._host_heap.clear()
        self._clean_heap.clear()
        self._num_device = 0
        self._num_clean = 0

    def forget(self, lost_slots: frozenset, failed_pages: frozenset) -> None:
        """Copies ran out of memory (runner_api.PageCopyError): host slots in `lost_slots`
        hold nothing and device pages in `failed_pages` garbage. Clean nodes keep their
        page without the copy; nodes left with no good copy leave with their subtree."""
        for node in list(self._nodes.values()):
            if node.node_id not in self._by_id:
                continue  # gone with an ancestor's subtree
            if node.page in failed_pages or (node.page is None and node.host_slot in lost_slots):
                self._remove_subtree(node)
            elif node.host_slot in lost_slots:
                self.host.release(node.host_slot)
                node.host_slot = None
                self._num_clean -= 1

    # ------------------------------------------------------------------ tiers

    def _room_for_loads(self, tokens, max_pages: int) -> None:
        """Free the device pages a match will load its spilled nodes into, in one reclaim
        before any load: the spills' saves then all precede the loads in the copy queue and
        the runner moves them in two large waves (page_store.waves), where reclaiming one
        page per load queued save, load, save, load, ... one page each."""
        chain, parent = [], ROOT
        for index in range(max_pages):
            node = self._nodes.get(self._key(tokens, index, parent))
            if node is None:
                break
            chain.append(node)
            parent = node.node_id
        short = sum(node.page is None for node in chain) - self.pool.num_free
        if short > 0:
            self.reclaim(short, protect=frozenset(node.node_id for node in chain))

    def _load(self, node: _Node) -> bool:
        """Bring a host node back into a fresh device page (its parent is on the device:
        the match walked it), keeping its slot as the clean copy. False when the device pool
        has no page to give."""
        if self.pool.num_free == 0:
            self.reclaim(1, protect=frozenset((node.node_id,)))
        if self.pool.num_free == 0 or node.node_id not in self._by_id:
            return False
        page = self.pool.alloc(1)[0]  # the cache's reference
        self.host.load(node.host_slot, page)
        self._num_clean += 1
        self._on_device(node, page)
        self.loaded_pages += 1
        return True

    def _write_through(self, node: _Node) -> None:
        """Save a newly published page to the host tier when a slot is free or a host-only
        leaf may give its slot (module docstring), so its eviction moves no bytes."""
        if self.host is None:
            return
        if not self.host.num_free and (self._num_clean >= self.clean_limit or
                                       not self._drop_host_leaf(node.keep, frozenset())):
            return
        node.host_slot = self.host.save(node.page)
        self._num_clean += 1
        self.written_pages += 1
        self._push_clean(node)

    def _to_host(self, node: _Node) -> None:
        """Free a clean node's device page: its host slot becomes the page's only home."""
        self.pool.release([node.page])
        node.page = None
        self._num_device -= 1
        self._num_clean -= 1
        parent = self._by_id.get(node.key[0])
        if parent is not None:
            parent.num_device_children -= 1
            self._push_leaf(parent)
        self._push_leaf(node)

    def _adopt(self, node: _Node, page: int) -> int:
        """The sequence computed `node`'s page itself: one copy stays (a host node keeps its
        slot as the clean copy). Returns the page the sequence holds from now on."""
        if node.page == page:
            return page
        if node.page is None:
            self.pool.share(page)
            self._num_clean += 1
            self._on_device(node, page)
        elif self.pool.refcount(node.page) == 1:  # an identical page nobody else holds
            self.pool.share(page)
            self.pool.release([node.page])
            node.page = page
        else:
            # Another sequence reads the cache's copy: the caller reads it too. Its own page
            # may still be written by a launched step; freed now, it is reused only by a
            # later step, which runs after that one.
            self.pool.share(node.page)
            self.pool.release([page])
            return node.page
        return page

    def _on_device(self, node: _Node, page: int) -> None:
        node.page = page
        self._num_device += 1
        parent = self._by_id.get(node.key[0])
        if parent is not None:
            parent.num_device_children += 1  # its device-heap entries are stale now
        self._push_leaf(node)

    def _host_room(self, keep: int, protect: frozenset) -> bool:
        """A free host slot for a spilled page of rank `keep`, dropping clean copies, then
        host leaves ranked no higher than it."""
        while not self.host.num_free:
            if not (self._drop_clean_copy() or self._drop_host_leaf(keep, protect)):
                return False
        return True

    def _drop_clean_copy(self) -> bool:
        """Release the host slot of the highest-ranked clean node (its page stays)."""
        while self._clean_heap:
            entry = heapq.heappop(self._clean_heap)
            node = self._by_id.get(-entry[2])
            if node is None or not node.is_clean or node.rank != _negated(entry):
                continue  # stale
            self.host.release(node.host_slot)
            node.host_slot = None
            self._num_clean -= 1
            return True
        return False

    def _drop_host_leaf(self, keep: int, protect: frozenset) -> bool:
        skipped, dropped = [], False
        while self._host_heap:
            entry = heapq.heappop(self._host_heap)
            node = self._by_id.get(entry[2])
            if node is None or node.page is not None or node.children or node.rank != entry:
                continue  # stale
            if node.node_id in protect:
                skipped.append(entry)
                continue
            if node.keep > keep:
                skipped.append(entry)
                break
            self._remove(node)
            dropped = True
            break
        for entry in skipped:
            heapq.heappush(self._host_heap, entry)
        return dropped

    # ------------------------------------------------------------------ tree upkeep

    def _add(self, key: tuple, page: int) -> _Node:
        node = _Node(next(self._ids), key, None, next(self._ticks))
        self.pool.share(page)
        self._nodes[key] = node
        self._by_id[node.node_id] = node
        parent = self._by_id.get(key[0])
        if parent is not None:
            parent.children.add(node.node_id)  # its host-heap entries are stale from now on
        self._on_device(node, page)
        return node

    def _touch(self, node: _Node) -> None:
        node.last_used = next(self._ticks)
        self._requeue(node)

    def _requeue(self, node: _Node) -> None:
        """`node`'s rank changed: queue it again where it belongs."""
        self._push_leaf(node)
        if node.is_clean:
            self._push_clean(node)

    def _push_clean(self, node: _Node) -> None:
        heapq.heappush(self._clean_heap, _negated(node.rank))
        if len(self._clean_heap) > 2 * len(self._nodes) + 64:
            self._rebuild_heaps()

    def _push_leaf(self, node: _Node) -> None:
        """Queue `node` in the heap of its tier when it is a leaf there."""
        if node.page is not None and not node.num_device_children:
            heap = self._device_heap
        elif node.page is None and not node.children:
            heap = self._host_heap
        else:
            return
        heapq.heappush(heap, node.rank)
        if len(heap) > 2 * len(self._nodes) + 64:
            self._rebuild_heaps()

    def _rebuild_heaps(self) -> None:
        """Drop the stale entries."""
        self._device_heap = [n.rank for n in self._nodes.values()
                             if n.page is not None and not n.num_device_children]
        self._host_heap = [n.rank for n in self._nodes.values()
                           if n.page is None and not n.children]
        self._clean_heap = [_negated(n.rank) for n in self._nodes.values() if n.is_clean]
        heapq.heapify(self._device_heap)
        heapq.heapify(self._host_heap)
        heapq.heapify(self._clean_heap)

    def _remove_subtree(self, node: _Node) -> None:
        """Drop `node` and what hangs below it (host-only descendants of a device leaf)."""
        for child_id in list(node.children):
            self._remove_subtree(self._by_id[child_id])
        self._remove(node)

    def _remove(self, leaf: _Node) -> None:
        del self._nodes[leaf.key]
        del self._by_id[leaf.node_id]
        if leaf.is_clean:
            self._num_clean -= 1
        if leaf.page is not None:
            self.pool.release([leaf.page])
            self._num_device -= 1
        if leaf.host_slot is not None:
            self.host.release(leaf.host_slot)
        if self.on_remove is not None:
            self.on_remove(leaf.node_id)
        parent = self._by_id.get(leaf.key[0])
        if parent is not None:
            parent.children.discard(leaf.node_id)
            if leaf.page is not None:
                parent.num_device_children -= 1
            self._push_leaf(parent)  # ranked by its own last use


def _negated(rank: tuple[int, int, int]) -> tuple[int, int, int]:
    return (-rank[0], -rank[1], -rank[2])
