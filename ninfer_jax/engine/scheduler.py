"""Scheduler: every host-side decision about which tokens run next.

The engine loop (engine/step_loop.py) calls, once per step:
    apply_controls()            cancellations, stop_at truncations, queue deadlines
    schedule() -> StepPlan      one ragged step: prefill chunks and/or decode rows
                                (None: nothing to run now; NEEDS_SYNC: collect first)
    launched(plan)              the plan is on the device: advance KV frontiers, note pending
    postprocess(plan, result)   when its tokens arrive: commit, stops, TokenPolicy, free pages
and nothing else touches the sequences, so no locks are needed here.

Launch/collect: step n+1 is planned and launched while step n still runs. A token step n
samples is *pending* until collected; a row of step n+1 feeds it back on the device
(`DecodeRow.from_previous`). A sequence that finishes in step n (end token, stop, cancel)
was already given a row in step n+1: that row's token is dropped at collect, and its KV write
lands in pages released meanwhile, which is harmless because steps run in launch order.
Rows whose next step needs the host's view of the last token (a TokenPolicy that stays on
the host: engine/policy_lanes.py) sit out while their token is pending. Presence/frequency
penalties and device token policies do not: their state lives on the device in the
sequence's lane (output counts, engine/penalty_lanes.py; a policy automaton,
model/token_automaton.py), which the step itself updates with the token it commits; the
scheduler only loads a lane when such a sequence becomes resident (admission, restore: the
counts of the committed output, the automaton at the host mirror's state, which follows
every commit and the step's flag saying whether a rule forced it), and reloads the counts after each commit of one with a host policy (which
may commit other tokens than the sampled one).

Speculative decoding (--spec, engine/speculation.py): a sequence that may draft (the request
did not say `draft: false`, has no penalties and no TokenPolicy) proposes drafts from its
committed tokens, so it is planned only when none of its tokens is pending; rather than let
it skip every other step, planning then waits for the step in flight (NEEDS_SYNC). Its round
is K + 1 rows at consecutive positions (`VerifySpan`); at collect the accepted prefix plus the
correction or bonus token is committed (stopping at an end token, max_tokens or the context
end exactly where plain decoding would), and its KV frontier moves to the last of them: the
rejected rows' KV is overwritten later. Drafts take only the rows left over by one row per
ready resident (the runner's row capacity; smaller in steps with a prefill chunk), oldest
first, and only pages that are free: a draft never pauses anyone.

Policies (see also sequence.py for the prefill/decode rule):
- Lanes: at most max_concurrency resident sequences; every step carries every decode-ready
  resident (oldest first, up to max_batch), plus one prefill chunk of the oldest resident
  that needs one. Fairness is counted in tokens, not time: decode rows ride along with each
  chunk, so streams advance every step. With decode_share 0 prompts go first: a step with a
  chunk carries no decode rows.
- Segments: a runner with chunk_segments > 1 takes the chunks of that many residents that
  need one (oldest first) in one step, each of at most segment_tokens tokens, so a burst of
  prompts is admitted in a few steps rather than one per prompt. A prompt with media runs
  alone (its vision encode belongs to the step's first chunk); a lone chunk is planned as
  with one segment (up to prefill_chunk).
- Priority: background requests are admitted only when no foreground request waits; when a
  foreground request waits for a lane or pages, the youngest background resident yields
  (paused: tokens kept, pages freed, resumed later by replay, nothing delivered twice).
- Pressure: before a step runs its pages are reserved; when the pool is short, pages only
  the prefix cache holds are reclaimed first, then the youngest resident (background ones
  first) is paused, so the oldest always progresses. A sequence in the step in flight is
  never paused: the plan asks the loop to collect first (NEEDS_SYNC). A request that alone
  outgrows the whole pool finishes with "length". A paused sequence's computed pages are
  copied to the host tier when it has room (a snapshot: restored without recomputation,
  behind what the prefix cache still holds), else it comes back by replay. Saves and loads
  of the host tier ride in the next plan (`page_copies`, engine/host_pages.py).
- Admission: the oldest paused sequence is restored first when its frontier plus one unit
  fits with a page of headroom per resident (so it is not paused again at once; one paused
  again before it ran anything waits until some request ends); otherwise fresh requests
  enter FIFO, and a later one that fits may overtake a head that does not, at most
  `max_bypass` times per head.
- State slots (hybrid models, engine/state_slots.py): a resident holds one slot from admission
  or restore until it is paused or ends, so a lane also needs a free slot (or a checkpoint
  to evict). Cached KV pages cannot rebuild a recurrent state, so a hybrid prefix hit only
  reaches the deepest cached node with a state checkpoint (engine/state_checkpoints.py),
  whose copy starts the sequence's slot; without one a sequence (a restored one too)
  starts from position 0. With a host tier, evicted checkpoints and pages spill there and
  a hit loads both back. Chunks end at a sequence's checkpoint marks, where it leaves them.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import logging
import operator
import time
from typing import Callable, Iterable

import numpy as np

from ninfer_jax.engine import prompt_media
from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.host_pages import DROP, LOAD, SAVE, HostPagePool, StateCopy
from ninfer_jax.engine.lifecycle import Lifecycle, TokenPolicyError
from ninfer_jax.engine.pages import PagePool, pages_for
from ninfer_jax.engine.prefix_cache import ROOT, PrefixCache
from ninfer_jax.engine.request import RequestHandle
from ninfer_jax.engine.runner_api import (
    DecodeRow, PageCopyError, PrefillUnit, SampleSpec, StepPlan, StepResult, VerifySpan,
    chunk_slot,
)
from ninfer_jax.engine.sequence import Sequence, Status
from ninfer_jax.engine.speculation import num_accepted
from ninfer_jax.engine.penalty_lanes import DUMMY_PENALTY_LANE, PenaltyLanes, uses_output
from ninfer_jax.engine.policy_lanes import DevicePolicy
from ninfer_jax.engine.speculative_rounds import SpeculativeRounds, drafted_rows
from ninfer_jax.engine.state_checkpoints import StateCheckpoints, marks
from ninfer_jax.engine.state_slots import DUMMY_STATE_SLOT, StateSlotPool
from ninfer_jax.errors import InternalError

log = logging.getLogger("ninfer_jax.engine.scheduler")


class _NeedsSync:
    """schedule()'s answer when the next plan must wait for the step in flight: a sequence in
    it would have to be paused, so its tokens must be committed first."""

    def __repr__(self) -> str:
        return "NEEDS_SYNC"


NEEDS_SYNC = _NeedsSync()
_SEQ_ID = operator.attrgetter("seq_id")


class _Sync(Exception):
    """Raised inside planning when it must stop and wait for the step in flight."""


class Scheduler:
    def __init__(self, config: EngineConfig, pool: PagePool, *, page_size: int,
                 max_batch: int, eos_ids: Iterable[int] = (),
                 clock: Callable[[], float] = time.monotonic,
                 slots: StateSlotPool | None = None, max_chunk_rows: int | None = None,
                 host: HostPagePool | None = None, vocab_size: int | None = None,
                 chunk_segments: int = 1, segment_tokens: int | None = None):
        self.config = config
        # The runner's vocabulary, which token policies compile over (policy_lanes.py);
        # None keeps every policy on the host.
        self.vocab_size = vocab_size
        self.pool = pool
        self.slots = slots if slots is not None else StateSlotPool(0)
        self.page_size = page_size
        # Rows per step: one per ready lane, plus verify rows up to the runner's capacity
        # (`max_rows`; `max_chunk_rows` in a step with a prefill chunk).
        self.max_batch = min(max_batch, config.max_concurrency)
        self.max_rows = max_batch
        self.max_chunk_rows = min(max_chunk_rows or max_batch, max_batch)
        # Chunks per step, each of at most segment_tokens tokens when there are several
        # (the runner's segments; 1: one chunk per step).
        self.chunk_segments = max(1, chunk_segments)
        self.segment_tokens = min(segment_tokens or config.prefill_chunk, config.prefill_chunk)
        self.clock = clock
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.resident: list[Sequence] = []  # sorted by seq_id: [0] is the oldest
        self.paused: list[Sequence] = []  # sorted by seq_id: restore order
        # The host tier (--host-context-mib): spilled prefix pages and pause snapshots.
        self.host = host if host is not None else HostPagePool(0)
        self.cache = PrefixCache(pool, page_size, self.host) if config.prefix_reuse else None
        self.checkpoints = None  # hybrid models with prefix reuse: their state checkpoints
        self._state_copies: list[StateCopy] = []  # state snapshot copies, without checkpoints
        if self.cache is not None and self.slots.has_state:
            # A hybrid's spilled pages are worth keeping only below a checkpoint, so its
            # checkpoints spill into the same budget, ranked as their nodes.
            self.checkpoints = StateCheckpoints(self.slots, self.cache.host,
                                                self.cache.free_host_for)
            self.cache.on_remove = self.checkpoints.forget
        self.life = Lifecycle(pool, clock, eos_ids, config.max_context, self.slots)
        self.counters = self.life.counters
        self.spec = SpeculativeRounds(config, pool, page_size, self.counters)
        self.penalty_lanes = PenaltyLanes(config.max_concurrency)
        self._next_seq_id = 0
        self._paused_now: set[int] = set()
        # seq id -> launched, uncollected steps that hold it
        self._in_flight: collections.Counter[int] = collections.Counter()

    # ------------------------------------------------------------------ intake and controls

    def add(self, handle: RequestHandle) -> Sequence:
        request = handle.request
        seq = Sequence(self._next_seq_id, handle, list(request.prompt_ids),
                       len(request.prompt_ids))
        seq.device_policy = DevicePolicy.compile(request.token_policy, self.vocab_size)
        if request.media:  # checked by Engine.submit; text prompts skip this entirely
            seq.media = prompt_media.build(request.media, seq.num_prompt, request.prompt_ids)
        # Pages up to the last explicit breakpoint are kept longest; `mode: explicit`
        # requests publish nothing past it (no automatic write).
        seq.keep_pages = max(request.cache_breakpoints, default=0) // self.page_size
        if not request.cache_implicit:
            seq.publish_limit = seq.keep_pages * self.page_size
        self._next_seq_id += 1
        self.waiting.append(seq)
        return seq

    def has_work(self) -> bool:
        return bool(self.waiting or self.resident or self.paused)

    def apply_controls(self) -> None:
        """Cancellations and stop_at from HTTP threads, and expired admission deadlines."""
        now = self.clock()
        for seq in list(self.waiting):
            if seq.handle.cancel_requested:
                self._end(seq, "cancelled")
            elif now >= self._deadline(seq):
                self._end_failed_timeout(seq)
        for seq in self.resident + self.paused:
            stop_at = seq.handle.stop_requested_at
            if seq.handle.cancel_requested:
                self._end(seq, "cancelled")
            elif stop_at is not None and stop_at <= seq.num_output:
                self.life.truncate_output(seq, stop_at)
                self._end(seq, "stop")

    def fail_all(self, error) -> None:
        for seq in list(self.waiting) + self.resident + self.paused:
            self._detach(seq)
            self.life.fail(seq, error)

    # ------------------------------------------------------------------ planning

    def schedule(self):
        """The next step's plan, None when nothing can run now, or NEEDS_SYNC."""
        self._paused_now = set()  # never restore within the round that paused it
        try:
            while True:
                self._yield_background()
                self._admit()
                if not self.resident:
                    return None
                planned = self._plan()
                if planned is not None:
                    return self._with_copies(planned) if planned.chunk or planned.rows else None
        except _Sync:
            return NEEDS_SYNC

    def _plan(self) -> StepPlan | None:
        """None when a reservation paused or ended chosen work (the caller re-plans)."""
        spec = self.spec
        if spec.drafter is not None and any(
                s.pending_slots and spec.can_draft(s) and not self._pending_ends(s)
                for s in self.resident):
            raise _Sync()  # a drafting sequence waits for its tokens: so does the plan
        chunk_seqs, ready = self._runnable()
        if not chunk_seqs and not ready and not self._in_flight and not any(
                s.is_decode_ready for s in self.resident):
            # Every resident either lacks KV for several tokens or for exactly its last one;
            # anything else is a bug, and re-planning would spin forever.
            raise RuntimeError("scheduler invariant broken: a resident has nothing to run")
        if chunk_seqs and self.config.decode_share == 0:
            ready = []  # prompts first
        max_rows = self.max_chunk_rows if chunk_seqs else self.max_rows
        ready = ready[: min(self.max_batch, max_rows)]
        limit = self.config.prefill_chunk if len(chunk_seqs) == 1 else self.segment_tokens
        chunk_ends = {s.seq_id: self._chunk_end(s, limit) for s in chunk_seqs}
        # Oldest first: a reservation only ever pauses younger sequences. (Both lists are in
        # resident order already; a decode row's pages mostly cover it: no call then.)
        wanted = sorted(ready + chunk_seqs, key=_SEQ_ID) if chunk_seqs else ready
        page_size = self.page_size
        for seq in wanted:
            if seq.status is not Status.RESIDENT:
                continue
            end = chunk_ends.get(seq.seq_id)
            if end is None:
                end = len(seq.tokens) + len(seq.pending_slots)
                if len(seq.pages) * page_size >= end:
                    continue
            if not self._reserve(seq, end):
                if seq.seq_id in chunk_ends or not any(s.status is Status.RESIDENT
                                                       for s in wanted):
                    return None
        if any(s.status is not Status.RESIDENT for s in chunk_seqs):
            return None  # a chunk's sequence was paused: plan again without it
        chunks = [self._chunk_unit(s, chunk_ends[s.seq_id]) for s in chunk_seqs]
        ready = [s for s in ready if s.status is Status.RESIDENT]
        drafts = spec.drafts(ready, max_rows - len(ready)) if spec.drafter is not None else {}
        if not drafts:
            rows = [self._decode_row(seq) for seq in ready]
            verify = []
        else:
            rows, verify = [], []
            for seq in ready:
                draft = drafts.get(seq.seq_id)
                if draft is None:
                    rows.append(self._decode_row(seq))
                else:
                    verify.append(VerifySpan(seq.seq_id, len(rows), draft))
                    rows += spec.rows(seq, draft, self._page_table(seq))
        return StepPlan(chunk=chunks[0] if chunks else None, more_chunks=tuple(chunks[1:]),
                        rows=tuple(rows), verify=tuple(verify))

    def _runnable(self) -> tuple[list[Sequence], list[Sequence]]:
        """The residents whose prefill chunks the next step carries, and those that may take
        a decode row (oldest first both), in one pass: this runs every step for every lane,
        so the Sequence properties are computed inline here (sequence.py defines them).
        Chunks: the oldest resident that needs one, then the next oldest up to
        chunk_segments; a prompt with media shares no step (the runner encodes the media
        of the first chunk only)."""
        chosen: list[Sequence] = []
        ready: list[Sequence] = []
        choosing = True
        max_context = self.config.max_context
        spec_on = self.spec.drafter is not None
        for seq in self.resident:
            total = len(seq.tokens) + len(seq.pending_slots)  # num_total
            num_output = total - seq.num_prompt  # num_output_total
            if num_output > 0 and total - seq.num_computed == 1:  # is_decode_ready
                if seq.pending_slots and not self._may_decode_pending(seq, spec_on):
                    continue
                if num_output >= seq.request.max_tokens or total >= max_context:
                    continue  # its pending token already ends it (_pending_ends)
                ready.append(seq)
            elif choosing and seq.num_computed < (total if num_output <= 0 else total - 1):
                if chosen and seq.media is not None:
                    continue
                chosen.append(seq)
                if len(chosen) >= self.chunk_segments or seq.media is not None:
                    choosing = False
        return chosen, ready

    def _may_decode_pending(self, seq: Sequence, spec_on: bool) -> bool:
        """Whether `seq`, whose last token is pending, may take a row now: not when that
        row needs the committed token on the host (a host token policy, a drafter)."""
        request = seq.request
        if request.token_policy is not None and seq.device_policy is None:
            return False
        return not (spec_on and self.spec.can_draft(seq))

    def _chunk_end(self, seq: Sequence, limit: int) -> int:
        """Where `seq`'s next chunk ends: at most `limit` tokens, and at a checkpoint mark."""
        end = min(seq.prefill_target, seq.num_computed + limit)
        checkpoints = self.checkpoints
        # Split only where a checkpoint can be kept (a free slot, or one to evict).
        if checkpoints is not None and (self.slots.num_free or checkpoints.num_checkpoints):
            for mark in self._marks(seq):
                if seq.num_computed < mark < end:
                    end = mark  # the state there is checkpointed once this chunk is launched
                    break
        return end

    def _marks(self, seq: Sequence) -> tuple[int, ...]:
        return marks(len(seq.tokens), seq.request.cache_breakpoints, self.page_size)

    def _with_copies(self, plan: StepPlan) -> StepPlan:
        """The plan with the state and page copies queued since the last one (run before
        it, in order)."""
        if self.host.copies:
            plan = dataclasses.replace(plan, page_copies=self.host.pop_copies())
        if self.checkpoints is not None and self.checkpoints.copies:
            plan = dataclasses.replace(plan, state_copies=self.checkpoints.pop_copies())
        elif self._state_copies:
            plan = dataclasses.replace(plan, state_copies=tuple(self._state_copies))
            self._state_copies = []
        if self.penalty_lanes.loads:
            plan = dataclasses.replace(plan, penalty_loads=self.penalty_lanes.pop_loads())
        return plan

    def copies_failed(self, error: PageCopyError) -> None:
        """The plan was not launched: some of its page copies ran out of memory (the others
        ran). The cache and paused requests forget slots that hold nothing, and a request
        that attached a page whose load failed fails; the rest is planned again. (A slot or
        page reused within that plan after the failed copy is forgotten too: it costs a
        cache entry, never a wrong page.)"""
        log.error("a step's host tier copies failed, its requests are planned again: %s",
                  error)
        lost, failed = error.lost_slots, error.failed_pages
        if self.cache is not None:
            self.cache.forget(lost, failed)
        for seq in list(self.paused):
            if seq.snapshot is not None and lost.intersection(seq.snapshot[1]):
                self._drop_snapshot(seq)
                self.life.snapshot_revoked(seq)
        for seq in list(self.resident):
            if failed.intersection(seq.pages):
                log.error("request_id=%s fails: a page of its context did not come back "
                          "from the host tier", seq.request_id)
                self._detach(seq)
                self.life.fail(seq, InternalError("the request's cached context could "
                                                  "not be restored (out of memory)"))

    def _queue_state_copy(self, copy: StateCopy) -> None:
        """State snapshots travel in order with the checkpoint copies (both touch slots)."""
        queue = self.checkpoints.copies if self.checkpoints is not None else self._state_copies
        queue.append(copy)

    def _pending_ends(self, seq: Sequence) -> bool:
        return (seq.num_output_total >= seq.request.max_tokens
                or seq.num_total >= self.config.max_context)

    def _chunk_unit(self, seq: Sequence, end: int) -> PrefillUnit:
        start = seq.num_computed
        sample = None
        if end == seq.num_total and seq.num_output_total == 0 and seq.request.max_tokens > 0:
            sample = self._sample_spec(seq)
        return PrefillUnit(seq_id=seq.seq_id, tokens=np.asarray(seq.tokens[start:end], np.int32),
                           start=start, page_table=self._page_table(seq), sample=sample,
                           state_slot=seq.state_slot, media=seq.media,
                           next_token=seq.tokens[end] if end < len(seq.tokens) else None)

    def _decode_row(self, seq: Sequence) -> DecodeRow:
        # (positional, the Sequence properties inline: this runs for every row of every step)
        pending = seq.pending_slots
        total = len(seq.tokens) + len(pending)
        sample = SampleSpec(seq.request.sampling, total - seq.num_prompt, seq.penalty_lane)
        media = seq.media
        return DecodeRow(seq.seq_id, 0 if pending else seq.tokens[-1], total - 1,
                         self._page_table(seq), sample, pending[-1] if pending else None,
                         seq.state_slot, 0 if media is None else media.rope_delta)

    @staticmethod
    def _page_table(seq: Sequence) -> np.ndarray:
        """seq.pages as int32, converted again only when the list changed: long contexts have
        thousands of pages and decode asks every round. Pages are only ever appended to a
        list or the list is replaced, so (the list object, its length) identifies the
        contents; the key holds the list itself, so its identity cannot be reused."""
        source, length = seq.page_table_key or (None, -1)
        if source is not seq.pages or length != len(seq.pages):
            seq.page_table = np.asarray(seq.pages, np.int32)
            seq.page_table_key = (seq.pages, len(seq.pages))
        return seq.page_table

    @staticmethod
    def _sample_spec(seq: Sequence) -> SampleSpec:
        return SampleSpec(params=seq.request.sampling, sample_index=seq.num_output_total,
                          penalty_lane=seq.penalty_lane)

    # ------------------------------------------------------------------ launch

    def launched(self, plan: StepPlan) -> None:
        """`plan` was dispatched: its KV counts as computed for planning and for the prefix
        cache (every later step runs after it on the device) and its samples are pending."""
        seqs = {s.seq_id: s for s in self.resident}
        for index, unit in enumerate(plan.chunks):
            seq = seqs[unit.seq_id]
            seq.num_computed = unit.start + len(unit.tokens)
            if unit.sample is not None:
                seq.pending_slots.append(chunk_slot(index))
            self._in_flight[seq.seq_id] += 1
            self._publish_prefix(seq)
            self._checkpoint(seq)
        drafted = drafted_rows(plan)
        for index, row in enumerate(plan.rows):
            seq = seqs[row.seq_id]
            seq.num_computed = row.position + 1
            self._in_flight[seq.seq_id] += 1
            if index not in drafted:  # a round's tokens are pending as one
                seq.pending_slots.append(index)
        self.spec.count_launched(plan, seqs)

    def _checkpoint(self, seq: Sequence) -> None:
        """A launched chunk ended at one of `seq`'s checkpoint marks: keep a copy of its
        state for the prefix cache node that ends there."""
        if self.checkpoints is None or seq.status is not Status.RESIDENT:
            return
        num_pages, node_id = seq.cache_cursor
        if (seq.num_computed == num_pages * self.page_size
                and seq.num_computed in self._marks(seq)):
            self.checkpoints.take(node_id, seq.state_slot)

    # ------------------------------------------------------------------ pressure

    def _reserve(self, seq: Sequence, num_positions: int) -> bool:
        """Give `seq` pages for positions [0, num_positions), pausing the youngest residents
        while the pool is short. False when `seq` itself was paused or ended."""
        while True:
            missing = pages_for(num_positions, self.page_size) - len(seq.pages)
            if missing > self.pool.num_free and self.cache is not None:
                self.cache.reclaim(missing)  # retained history goes before any request
            if missing <= self.pool.num_free:
                if missing > 0:
                    seq.pages.extend(self.pool.alloc(missing))
                return True
            victim = self._victim()
            if len(self.resident) == 1:
                # Alone and still short: the sequence outgrew the whole pool. Its tokens in
                # flight are collected first: they were sampled, so they are delivered.
                if self._in_flight[seq.seq_id]:
                    raise _Sync()
                self._end(seq, "length")
                return False
            self._pause(victim)
            if victim is seq:
                return False

    def _victim(self) -> Sequence:
        """Who yields pages: the youngest background resident, else the youngest one."""
        background = [s for s in self.resident if s.request.background]
        return background[-1] if background else self.resident[-1]

    def _pause(self, seq: Sequence) -> None:
        if self._in_flight[seq.seq_id]:
            raise _Sync()  # collect its step first, so its tokens are committed
        self.resident.remove(seq)
        if seq.num_computed == seq.computed_at_restore:
            seq.restore_gate = self._num_ended() + 1  # wait until something ends
        self.life.pause_started(seq)
        self._release_lane(seq)
        self.life.pause(seq, self._take_snapshot(seq))
        self._paused_now.add(seq.seq_id)
        seq.cache_cursor = (0, ROOT)
        seq.device_draft = None  # its slot's draft store will not survive a restore
        bisect.insort(self.paused, seq, key=lambda s: s.seq_id)

    def _take_snapshot(self, seq: Sequence) -> str:
        """Copy the pages of a sequence about to pause to the host tier when the budget
        allows (retained history there gives way): its route back, snapshot or replay.
        A hybrid sequence's recurrent state goes too (a StateCopy, `state_units` slots of
        the budget): its slot holds the state after exactly num_computed tokens, because no
        step of it is in flight and queued slot copies run before this one."""
        num_pages = pages_for(seq.num_computed, self.page_size)
        units = self.host.state_units if self.slots.has_state else 0
        if not self.host.is_enabled or not num_pages or (self.slots.has_state and not units):
            return "replay"
        need = num_pages + units
        if self.host.num_free < need and (
                self.cache is None or self.cache.host is None
                or not self.cache.free_host(need)):
            return "replay"
        slots = [self.host.save(page) for page in seq.pages[:num_pages]]
        state = None
        if units:
            state = self.host.reserve(units)
            self._queue_state_copy(StateCopy(SAVE, seq.state_slot, state[0]))
        seq.snapshot = (seq.num_computed, slots, state)
        return "snapshot"

    def _load_snapshot(self, seq: Sequence, cached: int) -> tuple[int, str]:
        """Bring a restoring sequence's snapshot back behind the `cached` tokens the prefix
        cache gave it: (its KV frontier, route). Revoked (replay) when the device pool
        cannot give the pages."""
        frontier, slots, state = seq.snapshot
        if state is not None and cached > frontier:
            # A deeper checkpoint than the pause point: it is the state to start from.
            self._drop_snapshot(seq)
            return cached, "replay"
        first = len(seq.pages)
        missing = max(0, len(slots) - first)
        if missing > self.pool.num_free and self.cache is not None:
            self.cache.reclaim(missing)
        if missing > self.pool.num_free:
            self._drop_snapshot(seq)
            self.life.snapshot_revoked(seq)
            return cached, "replay"
        pages = self.pool.alloc(missing)
        for slot, page in zip(slots[first:], pages):
            self.host.load(slot, page)
        for slot in slots:  # (the cache had the first pages already)
            self.host.release(slot)
        seq.pages = seq.pages + pages
        seq.snapshot = None
        if state is not None:  # the state at `frontier` comes back from host, not a checkpoint
            seq.state_source, seq.host_state = None, state
        return max(cached, frontier), "snapshot"

    def _drop_snapshot(self, seq: Sequence) -> None:
        if seq.snapshot is not None:
            _, slots, state = seq.snapshot
            for slot in slots:
                self.host.release(slot)
            if state is not None:
                self._queue_state_copy(StateCopy(DROP, DUMMY_STATE_SLOT, state[0]))
                self.host.unreserve(state)
            seq.snapshot = None

    def _yield_background(self) -> None:
        """The oldest waiting foreground request takes the lane or the pages it lacks from
        background residents, youngest first."""
        head = next((s for s in self.waiting if not s.request.background), None)
        while head is not None:
            background = [s for s in self.resident if s.request.background]
            if not background or (self._has_lane() and self._fits(head)):
                return
            self._pause(background[-1])

    # ------------------------------------------------------------------ admission

    def _has_lane(self) -> bool:
        """Whether one more sequence may become resident: a lane, and for hybrid models a
        state slot (more slots than lanes exist, but a slot might be held otherwise)."""
        if len(self.resident) >= self.config.max_concurrency:
            return False
        return (not self.slots.is_enabled or self.slots.num_free > 0
                or (self.checkpoints is not None and self.checkpoints.num_checkpoints > 0))

    def _admit(self) -> None:
        while self._has_lane():
            oldest_paused = self._restorable()
            if (oldest_paused is not None
                    and (not self.resident or self._num_ended() >= oldest_paused.restore_gate)
                    and self._fits(oldest_paused, headroom=len(self.resident))):
                self.paused.remove(oldest_paused)
                seq = oldest_paused
                self.life.restore_started(seq)
                cached = self._reuse_cached(seq)
                self._spare_slot()
                route = "replay"
                if seq.snapshot is not None:
                    cached, route = self._load_snapshot(seq, cached)
                self.life.restore(seq, cached, route)
                seq.computed_at_restore = seq.num_computed
            else:
                seq = self._pick_waiting()
                if seq is None:
                    return
                cached = self._reuse_cached(seq)
                self._spare_slot()
                self.life.admit(seq, cached)
            self._start_state(seq)
            if uses_output(seq.request.sampling) or seq.device_policy is not None:
                policy = seq.device_policy
                seq.penalty_lane = self.penalty_lanes.take(
                    seq.output_ids, None if policy is None else policy.row())
            bisect.insort(self.resident, seq, key=lambda s: s.seq_id)

    def _restorable(self) -> Sequence | None:
        """The paused sequence to restore next: the oldest, but background work stays paused
        while a foreground request waits."""
        foreground_waits = any(not s.request.background for s in self.waiting)
        for seq in self.paused:
            if seq.seq_id in self._paused_now:
                continue
            if seq.request.background and foreground_waits:
                continue
            return seq
        return None

    def _pick_waiting(self) -> Sequence | None:
        if not self.waiting:
            return None
        foreground = [s for s in self.waiting if not s.request.background]
        queue = foreground or list(self.waiting)
        head = queue[0]
        if self._fits(head):
            self.waiting.remove(head)
            return head
        if head.times_bypassed >= self.config.max_bypass:
            return None  # strict FIFO until the head gets in
        for seq in queue[1:]:
            if self._fits(seq):
                head.times_bypassed += 1
                self.waiting.remove(seq)
                return seq
        return None

    def _spare_slot(self) -> None:
        """A sequence is about to take a state slot: evict a checkpoint if none is free.
        (A checkpoint this very sequence matched may go: its copy, queued already, runs
        before any step could overwrite the freed slot.)"""
        if self.checkpoints is not None and not self.slots.num_free:
            self.checkpoints.evict_one()

    def _start_state(self, seq: Sequence) -> None:
        if seq.host_state is not None:  # a snapshot restore: the state row into its slot
            self._queue_state_copy(StateCopy(LOAD, seq.state_slot, seq.host_state[0]))
            self._queue_state_copy(StateCopy(DROP, DUMMY_STATE_SLOT, seq.host_state[0]))
            self.host.unreserve(seq.host_state)
            seq.host_state = None
        elif seq.state_source is not None:
            self.checkpoints.restore(seq.state_source, seq.state_slot)
            seq.state_source = None

    def _reuse_cached(self, seq: Sequence) -> int:
        """Attach the cached pages of `seq`'s longest known prefix; returns the tokens they
        cover. At least one token is always left to compute (it yields the next sample).
        Hybrid models: only as far as the deepest checkpoint (`state_source`)."""
        if self.cache is None:
            return 0
        if self.checkpoints is None:
            pages, last_node = self.cache.match(seq.cache_tokens, self._max_cached_pages(seq))
        else:
            pages, last_node = self._match_checkpointed(seq)
        seq.pages = pages
        seq.cache_cursor = (len(pages), last_node)
        return len(pages) * self.page_size

    def _match_checkpointed(self, seq: Sequence) -> tuple[list[int], int]:
        """A hybrid's match: pages (spilled ones loaded back) only up to the deepest node
        with a checkpoint in either tier, whose state starts the sequence (`state_source`)."""
        limit = (len(seq.tokens) - 1) // self.page_size
        depth = self.checkpoints.deepest(self.cache.chain(seq.cache_tokens, limit, host=True))
        pages, last_node = self.cache.match(seq.cache_tokens, depth)
        if len(pages) < depth:  # the device pool could not take every spilled page back
            ids = self.cache.chain(seq.cache_tokens, len(pages))
            usable = self.checkpoints.deepest(ids)
            self.pool.release(pages[usable:])
            pages, last_node = pages[:usable], (ids[usable - 1] if usable else ROOT)
        if pages:
            seq.state_source = self.checkpoints.source(last_node)
        return pages, last_node

    def _max_cached_pages(self, seq: Sequence) -> int:
        """Leading pages `seq` may reuse; hybrid models: up to the deepest checkpoint."""
        limit = (len(seq.tokens) - 1) // self.page_size
        if self.checkpoints is None:
            return limit
        return self.checkpoints.deepest(self.cache.chain(seq.cache_tokens, limit))

    def _fits(self, seq: Sequence, headroom: int = 0) -> bool:
        """Whether the pages `seq` needs up to its first sample (or, after a pause, up to and
        including one decode) are available beyond what residents' pending prefills will
        take. Cached pages it can reuse are not needed; reclaimable ones count as free."""
        if not self.resident:
            return True
        promised = sum(max(0, pages_for(s.prefill_target + 1, self.page_size) - len(s.pages))
                       for s in self.resident if s.needs_prefill)
        need = pages_for(seq.prefill_target + 1, self.page_size) + headroom
        available = self.pool.num_free - promised
        if self.cache is not None and need > available:
            matched, matched_reclaimable = self.cache.count_cached(
                seq.cache_tokens, self._max_cached_pages(seq))
            # Its own cached pages are reused, so they are not also free for it.
            need -= matched
            available += self._num_cache_only_pages() - matched_reclaimable
        return need <= available

    def _num_cache_only_pages(self) -> int:
        """Pages no sequence holds (paused and waiting ones hold none): the prefix cache's
        reclaimable pages, give or take a cached page pinned under a held one."""
        held = set()
        for seq in self.resident:
            held.update(seq.pages)
        return self.pool.num_used - len(held)

    def _num_ended(self) -> int:
        return sum(self.counters.requests.values())

    def _deadline(self, seq: Sequence) -> float:
        request = seq.request
        if request.deadline is not None:
            return request.deadline
        return request.arrival_time + self.config.pending_timeout

    # ------------------------------------------------------------------ results

    def postprocess(self, plan: StepPlan, result: StepResult, seconds: float) -> None:
        """Apply a collected step: commit its samples to the sequences still running (those
        that ended meanwhile drop theirs) and account its time (`seconds`, split between
        prefill and decode by their share of the step's tokens)."""
        in_flight = self._in_flight
        for seq_id in self._step_seq_ids(plan):
            left = in_flight[seq_id] - 1
            if left > 0:
                in_flight[seq_id] = left
            else:
                del in_flight[seq_id]  # no zero counts: `not self._in_flight` means idle
        live = {s.seq_id: s for s in self.resident}
        num_rows = len(plan.rows)
        chunk_tokens = sum(len(unit.tokens) for unit in plan.chunks)
        prefill_share = chunk_tokens / (chunk_tokens + num_rows) if chunk_tokens else 0.0
        if plan.chunk is not None:
            self.counters.prefill_seconds += seconds * prefill_share
            self._apply_vision(live.get(plan.chunk.seq_id), result)
        for index, unit in enumerate(plan.chunks):
            seq = live.get(unit.seq_id)
            if seq is None:
                continue
            self._apply_chunk(seq, unit, *result.chunk_sample(index))
            # a device drafter drafts after the first chunk's sample only
            if index == 0 and unit.sample is not None and result.chunk_draft is not None:
                self.spec.keep_device_draft(seq, result.chunk_draft)
        if num_rows:
            self.counters.record_decode(num_rows, seconds * (1.0 - prefill_share))
        if not plan.verify and result.row_drafts is None:
            self._commit_rows(plan.rows, result, live)
            return
        rounds = {span.first_row: span for span in plan.verify}
        drafted = drafted_rows(plan)
        for index, (row, token) in enumerate(zip(plan.rows, result.row_tokens)):
            seq = live.get(row.seq_id)
            if seq is None or seq.status is not Status.RESIDENT or index in drafted:
                continue  # ended while the step ran: its extra token is dropped
            span = rounds.get(index)
            drafts = result.row_drafts
            if span is not None:
                num = len(span.draft.tokens)
                accepted = self._apply_round(seq, span, row.position,
                                             result.row_tokens[index:index + num + 1])
                if drafts is not None:
                    self.spec.keep_device_draft(seq, drafts[index + accepted])
                continue
            self.life.computed(seq, row.position, row.position + 1, is_prefill=False)
            seq.pending_slots.pop(0)
            forced = result.row_forced is not None and bool(result.row_forced[index])
            self._commit(seq, int(token), from_decode=True, forced=forced)
            self._publish_prefix(seq)
            if drafts is not None:
                self.spec.keep_device_draft(seq, drafts[index])

    def _commit_rows(self, rows, result: StepResult, live: dict[int, Sequence]) -> None:
        """The plain decode rows of a step without speculation: one token each (the loop
        below in postprocess, less the rounds and drafts, for every row of every step)."""
        tokens, forced = result.row_tokens.tolist(), result.row_forced
        life, resident, cache, page_size = self.life, Status.RESIDENT, self.cache, self.page_size
        for index, row in enumerate(rows):
            seq = live.get(row.seq_id)
            if seq is None or seq.status is not resident:
                continue  # ended while the step ran: its extra token is dropped
            life.decoded(seq, row.position)
            seq.pending_slots.pop(0)
            if seq.device_policy is None and seq.request.token_policy is None:
                # no policy to follow or apply: what _commit does, less its policy steps
                finish = life.append(seq, (tokens[index],), from_decode=True)[1]
                if finish is not None:
                    self._end(seq, *finish)
                    continue
            else:
                self._commit(seq, tokens[index], from_decode=True,
                             forced=forced is not None and bool(forced[index]))
            if cache is not None and \
                    min(seq.num_computed, len(seq.tokens)) // page_size > seq.cache_cursor[0]:
                self._publish_prefix(seq)  # a page filled up (it checks the rest)

    def _apply_round(self, seq: Sequence, span: VerifySpan, position: int,
                     produced: np.ndarray) -> int:
        """Commit a speculative round (its first row at `position`): the accepted drafts and
        the correction (or bonus) token, up to the first that ends the request. Returns the
        number of drafts accepted."""
        accepted = num_accepted(span.draft, produced)
        seq.pending_slots.pop(0)
        self.life.computed(seq, position, position + accepted + 1, is_prefill=False)
        committed, finish = self.life.commit_run(seq, produced[:accepted + 1])
        self.spec.count_accepted(seq, min(accepted, committed))
        if finish is not None:
            self._end(seq, *finish)
            return accepted
        seq.num_computed = len(seq.tokens) - 1  # the rejected rows' KV is stale
        self._publish_prefix(seq)
        return accepted

    def _apply_vision(self, seq: Sequence | None, result: StepResult) -> None:
        """Count the step's vision encodes (of its first chunk's sequence: media never
        shares a step)."""
        if result.vision_items:
            self.counters.vision_items += result.vision_items
            self.counters.vision_seconds += result.vision_seconds
            if seq is not None:
                seq.counters["vision_items"] += result.vision_items
                seq.counters["vision_seconds"] += result.vision_seconds

    def _apply_chunk(self, seq: Sequence, unit: PrefillUnit, token, forced=False) -> None:
        self.life.computed(seq, unit.start, unit.start + len(unit.tokens), is_prefill=True)
        self._publish_prefix(seq)
        if unit.sample is not None:
            seq.pending_slots.pop(0)
            self._commit(seq, int(token), from_decode=False, forced=forced)
        elif seq.request.max_tokens == 0 and unit.start + len(unit.tokens) == seq.num_prompt:
            self._end(seq, "length")  # max_tokens 0: prompt processed, nothing to sample

    @staticmethod
    def _step_seq_ids(plan: StepPlan) -> list[int]:
        return [row.seq_id for row in plan.rows] + [unit.seq_id for unit in plan.chunks]

    def _publish_prefix(self, seq: Sequence) -> None:
        if self.cache is not None and seq.status is Status.RESIDENT:
            # Only committed tokens name a page's contents (a pending token's KV may exist).
            computed = min(seq.num_computed, len(seq.tokens))
            if seq.publish_limit is not None:
                computed = min(computed, seq.publish_limit)
            if computed // self.page_size > seq.cache_cursor[0]:  # a page filled up since
                start, end = seq.cache_cursor[0], computed // self.page_size
                before = seq.pages[start:end]
                seq.cache_cursor = self.cache.publish(seq.cache_tokens, seq.pages, computed,
                                                      seq.cache_cursor, seq.keep_pages)
                if seq.pages[start:end] != before:
                    # publish swapped a duplicate for the cache's page: a new list, so
                    # _page_table converts it again
                    seq.pages = list(seq.pages)

    def _commit(self, seq: Sequence, token: int, *, from_decode: bool,
                forced: bool = False) -> None:
        if seq.device_policy is not None:  # the step applied it: follow its state
            seq.device_policy.commit(token, forced)
        try:
            finish = self.life.commit(seq, token, from_decode=from_decode)
        except TokenPolicyError:
            log.exception("request_id=%s fails: its token policy raised", seq.request_id)
            self._detach(seq)
            self.life.fail(seq, InternalError("the request's token policy failed"))
            return
        if finish is not None:
            reason, matched = finish
            self._end(seq, reason, matched)
        elif (seq.penalty_lane != DUMMY_PENALTY_LANE and seq.request.token_policy is not None
              and seq.device_policy is None):
            # a host policy may have committed other tokens than the one the step counted
            self.penalty_lanes.reload(seq.penalty_lane, seq.output_ids)

    # ------------------------------------------------------------------ endings

    def _release_lane(self, seq: Sequence) -> None:
        if seq.penalty_lane != DUMMY_PENALTY_LANE:
            self.penalty_lanes.release(seq.penalty_lane)
            seq.penalty_lane = DUMMY_PENALTY_LANE

    def _detach(self, seq: Sequence) -> None:
        self._release_lane(seq)
        self._drop_snapshot(seq)
        for group in (self.resident, self.paused):
            if seq in group:
                group.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        seq.pending_slots.clear()

    def _end(self, seq: Sequence, reason: str, matched: int | None = None) -> None:
        self._detach(seq)
        self.life.finish(seq, reason, matched)

    def _end_failed_timeout(self, seq: Sequence) -> None:
        self._detach(seq)
        self.life.queue_timeout(seq)

    # ------------------------------------------------------------------ observation

    def gauges(self) -> dict:
        return {
            "running": len(self.resident),
            "waiting": len(self.waiting),
            "paused": len(self.paused),
            "prefilling": sum(s.needs_prefill for s in self.resident),
            "decode_ready": sum(s.is_decode_ready for s in self.resident),
            "replaying": sum(s.is_replaying for s in self.resident),
            "kv_pages_used": self.pool.num_used,
            "kv_pages_capacity": self.pool.capacity,
            "kv_pages_cached": self.cache.num_pages if self.cache is not None else 0,
            "page_size": self.page_size,
            "max_concurrency": self.config.max_concurrency,
            "state_slots_used": self.slots.num_used,
            "state_slots_capacity": self.slots.capacity,
            "host_pages_used": self.host.num_used,
            "host_pages_capacity": self.host.capacity,
            "host_pages_cached": (self.cache.num_host_pages + self.cache.num_clean_pages
                                  if self.cache is not None else 0),
            "host_pages_clean": self.cache.num_clean_pages if self.cache is not None else 0,
            "host_pages_checkpoints": (self.checkpoints.num_host_units
                                       if self.checkpoints is not None else 0),
            "host_pages_peak": self.host.peak_used,
            "host_page_bytes": self.host.page_bytes,
            "kv_bytes_to_host": self.host.bytes_saved,
            "kv_bytes_to_device": self.host.bytes_loaded,
        }

    def slot_holders(self) -> list[int]:
        """The state slot of every sequence and checkpoint (for StateSlotPool.check)."""
        holders = [s.state_slot for s in self.resident + self.paused + list(self.waiting)]
        if self.checkpoints is not None:
            holders += self.checkpoints.held_slots()
        return holders

    def lane_holders(self) -> list[int]:
        """The penalty lane of every sequence (for PenaltyLanes.check)."""
        return [s.penalty_lane for s in self.resident + self.paused + list(self.waiting)]

    def host_holders(self) -> list[int]:
        """Every held host slot (for HostPagePool.check)."""
        holders = [slot for s in self.paused if s.snapshot is not None for slot in s.snapshot[1]]
        if self.cache is not None:
            holders += self.cache.host_slots()
        return holders + [slot for row in self.host_state_rows() for slot in row]

    def host_state_rows(self) -> list[list[int]]:
        """The host slots of every state row: paused snapshots' (in host_holders too) and
        spilled checkpoints'; each row's [0] is its ticket."""
        rows = [s.snapshot[2] for s in self.paused if s.snapshot is not None and s.snapshot[2]]
        return rows + (self.checkpoints.host_rows() if self.checkpoints is not None else [])

    def page_holders(self) -> list[list[int]]:
        """Every page list that holds references (for PagePool.check)."""
        holders = [s.pages for s in self.resident + self.paused + list(self.waiting)]
        if self.cache is not None:
            holders.append(self.cache.pages())
        return holders
