"""SpeculativeRounds: the scheduler's part of speculative decoding (--spec).

Which sequences may draft, their drafts for one step (within the rows left, max_tokens, the
context end and the free KV pages), the K + 1 verify rows of a round, and the counters of
rounds, drafted, accepted and fallback steps (engine-wide and per request). The scheduler
(engine/scheduler.py) decides when a sequence runs and commits what a round accepted;
engine/speculation.py owns the drafters and the acceptance rule. Engine thread only.
"""
from __future__ import annotations

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.pages import PagePool, pages_for
from ninfer_jax.engine.penalty_lanes import uses_output
from ninfer_jax.engine.runner_api import DecodeRow, SampleSpec, StepPlan
from ninfer_jax.engine.sequence import Sequence, Status
from ninfer_jax.engine.speculation import EMPTY_DRAFT, Draft, TokenHistory, make_drafter
from ninfer_jax.engine.stats import EngineCounters


class SpeculativeRounds:
    def __init__(self, config: EngineConfig, pool: PagePool, page_size: int,
                 counters: EngineCounters):
        spec = config.speculative
        self.drafter = make_drafter(spec) if spec is not None else None
        self.draft_tokens = spec.draft_tokens if spec is not None else 0
        self.max_context = config.max_context
        self.pool, self.page_size, self.counters = pool, page_size, counters

    def speculates(self, seq: Sequence) -> bool:
        """The server speculates and the request did not opt out (`draft: false`)."""
        return self.drafter is not None and seq.request.speculative

    def can_draft(self, seq: Sequence) -> bool:
        """Eligible and decodable from the committed tokens alone. Token policies need the
        host's view of every token; penalties would need each verify row's lane to hold
        the drafts before it, which the counts do not: such requests decode plainly."""
        request = seq.request
        return (self.speculates(seq) and request.token_policy is None
                and not uses_output(request.sampling))

    def drafts(self, ready: list[Sequence], room: int) -> dict[int, Draft]:
        """Drafts for the ready sequences that may draft, oldest first, while `room` rows
        are left; each within its max_tokens, the context and the free pages (allocated
        here: a draft never pauses anyone)."""
        drafts: dict[int, Draft] = {}
        if self.drafter is None:
            return drafts
        for seq in ready:
            if room <= 0:
                break
            if seq.pending_slots or not self.can_draft(seq):
                continue
            num_tokens = len(seq.tokens)
            free_positions = (len(seq.pages) + self.pool.num_free) * self.page_size
            # A round of k drafts has rows at positions num_tokens - 1 .. num_tokens - 1 + k
            # and commits up to k + 1 tokens.
            k = min(self.draft_tokens, room, seq.request.max_tokens - seq.num_output - 1,
                    self.max_context - num_tokens - 1, free_positions - num_tokens)
            if k <= 0:
                continue
            if self.drafter.on_device:
                draft = self._device_draft(seq, k)
            else:
                if seq.history is None:
                    seq.history = TokenHistory()
                draft = self.drafter.propose(seq.history.view(seq.tokens), k)
            if not len(draft.tokens):
                continue
            missing = pages_for(num_tokens + len(draft.tokens), self.page_size) - len(seq.pages)
            if missing > 0:
                seq.pages.extend(self.pool.alloc(missing))
            drafts[seq.seq_id] = draft
            room -= len(draft.tokens)
        return drafts

    @staticmethod
    def _device_draft(seq: Sequence, k: int) -> Draft:
        """The drafts the step that committed seq's last token made (none when that step
        did not draft for it: after a pause, a full prefix hit, a request that ended)."""
        kept = seq.device_draft
        if kept is None or kept[0] != len(seq.tokens):
            return Draft(EMPTY_DRAFT)
        return Draft(kept[1][:k])

    def keep_device_draft(self, seq: Sequence, drafts) -> None:
        """A collected step's drafts after seq's (new) last token (`Draft` for next round)."""
        if self.drafter is not None and self.drafter.on_device and \
                seq.status is Status.RESIDENT:
            seq.device_draft = (len(seq.tokens), drafts)

    @staticmethod
    def rows(seq: Sequence, draft: Draft, page_table) -> list[DecodeRow]:
        """Rows for [last committed token, d_1..d_k] at positions p..p+k; row i samples
        output position n + i with the SampleSpec plain decoding would give it."""
        position, num_output = len(seq.tokens) - 1, seq.num_output
        params = seq.request.sampling
        tokens = [seq.tokens[-1], *draft.tokens.tolist()]
        return [DecodeRow(seq_id=seq.seq_id, token=token, position=position + i,
                          page_table=page_table, sample=SampleSpec(params, num_output + i),
                          state_slot=seq.state_slot, rope_delta=seq.rope_delta)
                for i, token in enumerate(tokens)]

    def count_launched(self, plan: StepPlan, seqs: dict[int, Sequence]) -> None:
        """A launched step's rounds and drafts, and the rows of eligible sequences that ran
        without drafts (fallback steps)."""
        if self.drafter is None:
            return
        counters = self.counters
        for span in plan.verify:
            seq, num = seqs[span.seq_id], len(span.draft.tokens)
            counters.spec_rounds += 1
            counters.spec_draft_tokens += num
            seq.counters["spec_rounds"] += 1
            seq.counters["spec_drafted"] += num
        skip = {span.first_row for span in plan.verify} | drafted_rows(plan)
        for index, row in enumerate(plan.rows):
            seq = seqs[row.seq_id]
            if index not in skip and self.speculates(seq):
                counters.spec_fallback_steps += 1
                seq.counters["spec_fallback_steps"] += 1

    def count_accepted(self, seq: Sequence, accepted: int) -> None:
        self.counters.spec_accepted_tokens += accepted
        seq.counters["spec_accepted"] += accepted
        per_position = seq.counters["spec_accepted_per_position"]
        if not per_position:
            per_position.extend([0] * self.draft_tokens)
        for i in range(accepted):
            per_position[i] += 1


def drafted_rows(plan: StepPlan) -> set[int]:
    """Indexes of the rows that feed drafts (each round's rows after its first)."""
    return {span.first_row + j for span in plan.verify
            for j in range(1, len(span.draft.tokens) + 1)}
