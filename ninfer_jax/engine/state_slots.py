"""StateSlotPool: ownership of the device state slots of hybrid models.

A hybrid sequence's device state is its KV pages (attention layers) plus one state slot: the
conv and recurrent state of every Gated DeltaNet layer, one row of each per-layer state array
(model/config.py `state_shapes`); for Gemma 4 the slot holds its sliding layers' KV rings
(model/gemma.py), which follow the same rules. Slots are numbered 0..capacity. Slot
DUMMY_STATE_SLOT (0)
belongs to nobody: padding rows and padding chunks read and write it, like DUMMY_PAGE, so it
is never handed out. Unlike a page a slot is never shared: the state after token n is one
value per sequence, not a function of a prefix that several sequences could hold.

Invariant the scheduler keeps: a held slot contains the state after exactly the sequence's
first `num_computed` tokens. A slot is taken when a sequence becomes resident (admission or
restore) with num_computed == 0, whose first chunk starts at position 0 and so makes the
model start from a zero state, or at a prefix hit together with the copy of a state
checkpoint (engine/state_checkpoints.py, whose checkpoints hold slots of this pool too); it
is given back when the sequence is paused or ends.

Dense models have no state: their pool has capacity 0, `is_enabled` is False and nothing is
ever allocated, except under a DFlash drafter (--spec dflash / dflash2), whose draft store
(the proposal q of a sequence's pending drafts, model/dflash.py) is per slot: that pool has
`holds_state` False, one slot per lane, taken and given back as above, and nothing to keep
(no checkpoints, no host copies, a fresh slot at any position: a step writes a sequence's
store together with the drafts it reads it for, and a pause drops held drafts).
Only the engine thread touches a pool; it has no locks.
"""
from __future__ import annotations

from typing import Iterable

from ninfer_jax.engine.numbered_pool import NumberedPool

# Must equal model.ragged_batch.DUMMY_STATE_SLOT (a test checks); defined here so the
# host-side engine never imports JAX.
DUMMY_STATE_SLOT = 0


class SlotsExhausted(RuntimeError):
    """alloc() found no free slot (the scheduler checks `num_free` first)."""


def extra_slots(requested: int | None, max_concurrency: int) -> int:
    """--device-state-slots as resolved: unset means one spare slot per lane, the spec's
    default (spare slots hold the prefix checkpoints of hybrid models)."""
    return max_concurrency if requested is None else requested


def state_slot_capacity(*, has_state: bool, max_concurrency: int, extra_slots: int) -> int:
    """Usable slots of a model: one per lane plus `extra_slots` (--device-state-slots) for a
    model with recurrent state, none for a dense one."""
    return max_concurrency + extra_slots if has_state else 0


class StateSlotPool(NumberedPool):
    def __init__(self, capacity: int, holds_state: bool = True):
        if capacity < 0:
            raise ValueError("a state slot pool cannot have a negative capacity")
        super().__init__(capacity)
        self.holds_state = holds_state
        self._held = [False] * (capacity + 1)

    @property
    def is_enabled(self) -> bool:
        """Whether the model has state slots at all (False for dense models)."""
        return self.capacity > 0

    @property
    def has_state(self) -> bool:
        """Whether held slots carry a state the scheduler must keep (hybrid models); False
        for no slots and for a dense model's draft-store slots."""
        return self.is_enabled and self.holds_state

    @property
    def num_slots(self) -> int:
        """Slots on the device, the dummy slot included (0 when disabled)."""
        return self.capacity + 1 if self.is_enabled else 0

    def alloc(self) -> int:
        if not self._free:
            raise SlotsExhausted(f"all {self.capacity} state slots are held")
        slot = self._free.popleft()
        self._held[slot] = True
        return slot

    def release(self, slot: int) -> None:
        if slot == DUMMY_STATE_SLOT or not 0 < slot <= self.capacity or not self._held[slot]:
            raise ValueError(f"release of state slot {slot}, which is not held")
        self._held[slot] = False
        self._free.append(slot)

    def check(self, holders: Iterable[int]) -> None:
        """Raise AssertionError unless the held slots are exactly `holders` (one slot per
        holder, DUMMY_STATE_SLOT entries ignored): no leak, no slot held twice."""
        held = [slot for slot in holders if slot != DUMMY_STATE_SLOT]
        problems = []
        if len(set(held)) != len(held):
            problems.append(f"a state slot has two holders: {sorted(held)}")
        expected = set(held)
        actual = {slot for slot in range(1, self.capacity + 1) if self._held[slot]}
        if expected != actual:
            problems.append(f"held slots {sorted(actual)}, holders {sorted(expected)}")
        if len(self._free) + len(actual) != self.capacity:
            problems.append("the free list disagrees with the held slots")
        if problems:
            raise AssertionError("; ".join(problems))
