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
leaving the prefix cache (its pages reclaimed) frees its checkpoint (`forget`). Engine thread
only.
"""
from __future__ import annotations

import collections

from ninfer_jax.engine.state_slots import StateSlotPool


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
    def __init__(self, slots: StateSlotPool):
        self.slots = slots
        self._by_node: collections.OrderedDict[int, int] = collections.OrderedDict()  # LRU
        self.copies: list[tuple[int, int]] = []  # (src, dst) slot copies not yet launched

    @property
    def num_checkpoints(self) -> int:
        return len(self._by_node)

    def held_slots(self) -> list[int]:
        return list(self._by_node.values())

    def slot_at(self, node_id: int) -> int | None:
        """The checkpoint of a prefix cache node, marked as just used; None without one."""
        slot = self._by_node.get(node_id)
        if slot is not None:
            self._by_node.move_to_end(node_id)
        return slot

    def deepest(self, node_ids: list[int]) -> int:
        """How many leading nodes of a matched chain are usable: up to the deepest node
        with a checkpoint (0: none)."""
        for depth in range(len(node_ids), 0, -1):
            if node_ids[depth - 1] in self._by_node:
                return depth
        return 0

    def take(self, node_id: int, src_slot: int) -> bool:
        """Checkpoint `src_slot` (a sequence's slot whose state now ends at the node) for
        `node_id`, in a free slot or the least recently used checkpoint's. False when no
        slot can be spared or the node already has one."""
        if node_id in self._by_node:
            return False
        if not self.slots.num_free and not self.evict_one():
            return False
        slot = self.slots.alloc()
        self._by_node[node_id] = slot
        self.copies.append((src_slot, slot))
        return True

    def restore(self, src_slot: int, dst_slot: int) -> None:
        """Queue the copy that starts a sequence's slot from a checkpoint (`slot_at`)."""
        self.copies.append((src_slot, dst_slot))

    def evict_one(self) -> bool:
        """Free the least recently used checkpoint's slot; False when there is none."""
        if not self._by_node:
            return False
        _, slot = self._by_node.popitem(last=False)
        self.slots.release(slot)
        return True

    def forget(self, node_id: int) -> None:
        """The node left the prefix cache: its checkpoint goes too."""
        slot = self._by_node.pop(node_id, None)
        if slot is not None:
            self.slots.release(slot)

    def pop_copies(self) -> tuple[tuple[int, int], ...]:
        copies, self.copies = tuple(self.copies), []
        return copies
