"""DevicePolicy: a request's TokenPolicy as the device applies it, and its host mirror.

A policy that compiles to an automaton (model/token_automaton.py, `policy.automaton(V)`)
runs inside the step: the sequence holds a lane (the penalty lanes' pool, one lane per
resident sequence: engine/penalty_lanes.py) whose automaton row the runner keeps on the
device next to the lane's output counts, and every step advances it with the token it
commits there. Such a sequence needs nothing from the host between steps, so it rides the
launch-ahead pipeline; the tokens it commits are those the host policy's `adjust` would
have committed, one per step instead of a forced run at once.

The host mirrors the automaton: each committed token advances `node`/`counter` as `advance`
moved the lane (`Automaton.follow`), told by the step whether a rule forced it (the FORCED_BIT
of its `out` slot, StepResult's chunk_forced/row_forced): a forced token may be one its node
would keep if sampled (ForcedToolCall's name completion starts with a token the name state
keeps), so the committed output alone does not say which path the lane took. A lane is loaded with the mirror's state whenever the sequence becomes
resident (admission, restore after a pause, by replay or snapshot alike). What the policy
records for the HTTP side (`ThinkingBudget.applied`) is updated from the mirror.

A policy that does not compile (several chained policies, an automaton too large for a
lane, a tokenizer whose decode the automaton cannot follow) stays on the host: `adjust` after every sample, and its rows sit out
while their token is pending (scheduler.py).
"""
from __future__ import annotations

import logging


from ninfer_jax.model.token_automaton import Automaton

log = logging.getLogger("ninfer_jax.engine.scheduler")


class DevicePolicy:
    def __init__(self, policy, automaton: Automaton):
        self.policy = policy
        self.automaton = automaton
        self.node, self.counter = automaton.start, 0

    @classmethod
    def compile(cls, policy, vocab_size: int | None) -> "DevicePolicy | None":
        """The device form of `policy`, or None when it stays on the host."""
        if policy is None or vocab_size is None or not hasattr(policy, "automaton"):
            return None
        try:
            return cls(policy, policy.automaton(vocab_size))
        except ValueError as exc:
            log.debug("token policy %s stays on the host: %s", type(policy).__name__, exc)
            return None

    def row(self) -> np.ndarray:
        """The lane row at the mirror's state (what a lane load writes)."""
        return self.automaton.row(self.node, self.counter)

    def commit(self, token: int, forced: bool) -> None:
        """Advance the mirror over one committed token; `forced`: the step's rule forced it
        (StepResult's flags), which the token alone does not tell."""
        if forced and self.node in self.automaton.rule_nodes:
            self.policy.record_applied()
        self.node, self.counter = self.automaton.follow(self.node, self.counter, token, forced)
