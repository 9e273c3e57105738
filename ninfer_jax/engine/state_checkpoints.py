"""StateCheckpoints: prefix reuse for hybrid models, whose state KV pages cannot rebuild.

A hybrid sequence's device state after n tokens is its KV pages for [0, n) plus the recurrent
state after exactly n tokens. The prefix cache (prefix_cache.py) keeps the pages; this module
keeps, for some of its nodes, a copy of the state after the node's last token in a state slot
of its own (a checkpoint). A later request may reuse a cached prefix only up to the deepest
node with a checkpoint: it takes the pages and starts from a copy of the checkpoint.

Where checkpoints come from: the scheduler ends prefill chunks exactly at a sequence's
*checkpoint marks* (`marks`: its longest matchable prefix, the last whole page before its
last token, plus the whole pages before each of the request's cache breakpoints, the ends
of client messages a next turn repeats), and once such a chunk is launched it copies the
sequence's slot into a checkpoint slot. Copies are device operations (`StepPlan.state_copies`): the runner applies
them in order before the step they ride with, so a copy sees every earlier step's state and
none of its own step's. Everything here is therefore stated "as of after the queued copies".

Slots: checkpoints take free slots of the same pool as residents (--device-state-slots adds
room for them). A resident needing a slot evicts the least recently used checkpoint; a node
leaving the prefix cache (dropped from both tiers) frees its checkpoint (`forget`).

The host tier: with one (`host` with `state_units`), an evicted checkpoint is not lost but
spilled: its slot is saved into a host row (a StateCopy, `state_units` slots of the host
budget that `make_room(units, node_id)` frees by the prefix cache's rules, ranked as the
node) before the slot is released; the save is queued ahead of whatever the slot's next
owner queues, so order alone makes it correct. A hit on a host checkpoint loads the row into
the sequence's fresh slot and keeps it (the row stays the checkpoint's home, as a loaded page
keeps its clean copy), so hits move state one way. A row leaves with its node. Checkpoints
are not written through at creation: a state row is many pages' worth, and a checkpoint no
resident displaces never needs one. Engine thread only.
"""
from __future__ import annotations

import collections
from typing import Callable

from ninfer_jax.engine.host_pages import DROP, LOAD, SAVE, HostPagePool, StateCopy
from ninfer_jax.engine.state_slots import DUMMY_STATE_SLOT, StateSlotPool


def boundary(num_tokens: int, page_size: int) -> int:
    """The checkpoint boundary of a sequence of `num_tokens` tokens: the longest prefix a
    request can reuse (whole pages, at least one token left to compute)."""
    return (num_tokens - 1) // page_size * page_size


def marks(num_tokens: int, breakpoints, page_size: int) -> tuple[int, ...]:
    """Where a sequence of `num_tokens` tokens with these cache breakpoints (prompt token
    offsets) leaves checkpoints, ascending: whole pages only, none past `boundary`."""
    last = boundary(num_tokens, page_size)
    points = {offset // page_size * page_size for offset in breakpoints} | {last}
    return tuple(sorted(mark for mark in points if 0 < mark <= last))


class StateCheckpoints:
    def __init__(self, slots: StateSlotPool, host: HostPagePool | None = None,
                 make_room: Callable[[int, int], bool] | None = None):
        self.slots = slots
        # Spill to host only when a state row has a size in its budget.
        self.host = host if host is not None and host.state_units else None
        self.make_room = make_room
        self._by_node: collections.OrderedDict[int, int] = collections.OrderedDict()  # LRU
        self._rows: dict[int, list[int]] = {}  # node id -> its host row's slots ([0] ticket)
        # (src, dst) slot copies and StateCopy rows, in order, not yet launched
        self.copies: list = []
        self.spilled = 0  # cumulative checkpoints saved to the host tier
        self.loaded = 0  # cumulative hits that started from a host row

    @property
    def num_checkpoints(self) -> int:
        """Checkpoints in a device slot."""
        return len(self._by_node)

    @property
    def num_host_checkpoints(self) -> int:
        """Checkpoints in a host row (a checkpoint has one home: `take` skips any node
        that has a checkpoint, and a hit on a row does not bring it back to a slot)."""
        return len(self._rows)

    @property
    def num_host_units(self) -> int:
        """Host tier slots the rows hold."""
        return sum(len(row) for row in self._rows.values())

    def held_slots(self) -> list[int]:
        return list(self._by_node.values())

    def host_rows(self) -> list[list[int]]:
        return list(self._rows.values())

    def slot_at(self, node_id: int) -> int | None:
        """The checkpoint of a prefix cache node, marked as just used; None without one."""
        slot = self._by_node.get(node_id)
        if slot is not None:
            self._by_node.move_to_end(node_id)
        return slot

    def source(self, node_id: int) -> tuple[str, int] | None:
        """Where a hit at `node_id` starts its state: ("slot", device slot), else ("row",
        host ticket); None without a checkpoint."""
        slot = self.slot_at(node_id)
        if slot is not None:
            return ("slot", slot)
        row = self._rows.get(node_id)
        return ("row", row[0]) if row is not None else None

    def has(self, node_id: int) -> bool:
        return node_id in self._by_node or node_id in self._rows

    def deepest(self, node_ids: list[int]) -> int:
        """How many leading nodes of a matched chain are usable: up to the deepest node
        with a checkpoint, in either tier (0: none)."""
        for depth in range(len(node_ids), 0, -1):
            if self.has(node_ids[depth - 1]):
                return depth
        return 0

    def take(self, node_id: int, src_slot: int) -> bool:
        """Checkpoint `src_slot` (a sequence's slot whose state now ends at the node) for
        `node_id`, in a free slot or the least recently used checkpoint's. False when no
        slot can be spared or the node already has one."""
        if self.has(node_id):
            return False
        if not self.slots.num_free and not self.evict_one():
            return False
        slot = self.slots.alloc()
        self._by_node[node_id] = slot
        self.copies.append((src_slot, slot))
        return True

    def restore(self, source: tuple[str, int], dst_slot: int) -> None:
        """Queue the copy that starts a sequence's slot from a checkpoint (`source`)."""
        kind, where = source
        if kind == "slot":
            self.copies.append((where, dst_slot))
        else:
            self.copies.append(StateCopy(LOAD, dst_slot, where))
            self.loaded += 1

    def evict_one(self) -> bool:
        """Free the least recently used checkpoint's slot, spilling it to a host row when
        the budget has room; False when there is none."""
        if not self._by_node:
            return False
        node_id, slot = self._by_node.popitem(last=False)
        if self.host is not None and self.make_room(self.host.state_units, node_id):
            row = self.host.reserve(self.host.state_units)
            self._rows[node_id] = row
            self.copies.append(StateCopy(SAVE, slot, row[0]))
            self.spilled += 1
        self.slots.release(slot)
        return True

    def forget(self, node_id: int) -> None:
        """The node left the prefix cache: its checkpoint goes too, from either tier."""
        slot = self._by_node.pop(node_id, None)
        if slot is not None:
            self.slots.release(slot)
        row = self._rows.pop(node_id, None)
        if row is not None:
            self.copies.append(StateCopy(DROP, DUMMY_STATE_SLOT, row[0]))
            self.host.unreserve(row)

    def pop_copies(self) -> tuple:
        copies, self.copies = tuple(self.copies), []
        return copies
