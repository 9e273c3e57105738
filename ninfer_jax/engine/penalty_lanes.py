"""PenaltyLanes: ownership of the device-resident output counts of penalised requests.

Presence/frequency penalties read how often each token occurs in a request's committed
output. The runner keeps those counts on the device, int32 [lanes + 1, V] (JaxRunner
`penalty_counts`, FakeRunner likewise), one row per lane; the compiled step reads each
row's lane for its bias and adds the token it samples there (model/sampling.py). So a
penalised row needs nothing from the host between steps and rides the launch-ahead
pipeline like any other row.

Lane DUMMY_PENALTY_LANE (0) belongs to nobody: rows without penalties and padding read its
zeros and never add to it. A lane is taken when a penalised sequence becomes resident
(admission, restore after a pause) and given back when it is paused or ends; taking it
queues a load of the lane from the committed output (`PenaltyLoad`, applied on the device
before the plan's step, after every step launched earlier). Invariant: once every step
launched so far has run, a held lane holds the counts of its sequence's committed output
plus its pending tokens. The extra token a finished sequence's last row samples is counted
in a lane nobody reads again before its next load. The step counts the token it commits,
after the lane's token-policy automaton (engine/policy_lanes.py: a sequence with a device
policy holds a lane too, penalties or not). A policy that stays on the host may commit other
tokens than the sampled one: such a sequence's lane is reloaded after each commit (it sits
out while its token is pending anyway). Penalised requests never draft, so a lane never
sees verify rows.

One lane per resident sequence at most, so max_concurrency lanes always suffice: the
counts cost (max_concurrency + 1) * V * 4 bytes of device memory (docs/architecture.md).
Only the engine thread touches a pool; it has no locks.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple

from ninfer_jax.engine.numbered_pool import NumberedPool

# Must equal model.sampling.DUMMY_PENALTY_LANE (a test checks); defined here so the
# host-side engine never imports JAX.
DUMMY_PENALTY_LANE = 0


class PenaltyLoad(NamedTuple):
    """Set `lane` of the output counts to the counts of `output_ids`, and its token-policy
    automaton row to `policy` (int32 [token_automaton.ROW_WIDTH]; None: all zeros, the
    identity) (StepPlan)."""

    lane: int
    output_ids: tuple[int, ...]
    policy: object = None


def penalty_counts_bytes(lanes: int, vocab_size: int) -> int:
    """Device bytes of the output counts and token-policy automata (policy_lanes.py) of
    `lanes` lanes (and the dummy)."""
    from ninfer_jax.model.token_automaton import ROW_WIDTH

    return (lanes + 1) * (vocab_size + ROW_WIDTH) * 4


def uses_output(params) -> bool:
    """Whether sampling reads the committed output (presence/frequency penalties)."""
    return params.presence_penalty != 0 or params.frequency_penalty != 0


class PenaltyLanes(NumberedPool):
    def __init__(self, capacity: int):
        super().__init__(capacity)
        self._held = [False] * (capacity + 1)
        self.loads: list[PenaltyLoad] = []  # queued for the next plan

    def take(self, output_ids: Iterable[int], policy=None) -> int:
        """A free lane, loaded (at the next plan) with the counts of `output_ids` and the
        automaton row `policy` (engine/policy_lanes.py)."""
        if not self._free:
            raise RuntimeError(f"all {self.capacity} penalty lanes are held")
        lane = self._free.popleft()
        self._held[lane] = True
        self.reload(lane, output_ids, policy)
        return lane

    def reload(self, lane: int, output_ids: Iterable[int], policy=None) -> None:
        self.loads.append(PenaltyLoad(lane, tuple(output_ids), policy))

    def release(self, lane: int) -> None:
        if lane == DUMMY_PENALTY_LANE or not self._held[lane]:
            raise ValueError(f"release of penalty lane {lane}, which is not held")
        self._held[lane] = False
        self._free.append(lane)

    def pop_loads(self) -> tuple[PenaltyLoad, ...]:
        loads, self.loads = tuple(self.loads), []
        return loads

    def check(self, holders: Iterable[int]) -> None:
        """Raise AssertionError unless the held lanes are exactly `holders` (dummy ignored)."""
        held = [lane for lane in holders if lane != DUMMY_PENALTY_LANE]
        actual = {lane for lane in range(1, self.capacity + 1) if self._held[lane]}
        if len(set(held)) != len(held) or set(held) != actual:
            raise AssertionError(f"held penalty lanes {sorted(actual)}, holders {sorted(held)}")
