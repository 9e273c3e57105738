"""Scheduler: every host-side decision about which tokens run next.

The engine thread calls, once per round:
    apply_controls()          cancellations, stop_at truncations, queue deadlines
    schedule() -> Schedule    one PrefillUnit, or one compact decode batch (or None: idle)
    postprocess(s, sampled)   commit tokens, apply stops and TokenPolicy, free pages
and nothing else touches the sequences, so no locks are needed here.

Policies (see also sequence.py for the prefill/decode rule):
- Lanes: at most max_concurrency resident sequences; decode batches hold every decode-ready
  resident, oldest first, never an empty row.
- Prefill: one chunk of the oldest resident that needs prefill. While decodes are also ready,
  they get rounds worth `decode_share` of the prefill time (a credit carried across rounds).
- Pressure: before a unit runs its pages are reserved; when the pool is short, pages only
  the prefix cache holds are reclaimed first, then the youngest resident is paused (pages
  freed, tokens kept), so the oldest always progresses. A request that alone outgrows the
  whole pool finishes with "length".
- Admission: the oldest paused sequence is restored first when its frontier plus one unit
  fits with a page of headroom per resident (so it is not paused again at once; one paused
  again before it ran anything waits until some request ends); otherwise fresh requests
  enter FIFO, and a later one that fits may overtake a head that does not, at most
  `max_bypass` times per head.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import logging
import time
from typing import Callable, Iterable

import numpy as np

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.lifecycle import Lifecycle, TokenPolicyError
from ninfer_jax.engine.pages import PagePool, pages_for
from ninfer_jax.engine.prefix_cache import ROOT, PrefixCache
from ninfer_jax.engine.request import RequestHandle
from ninfer_jax.engine.runner_api import DecodeRow, PrefillUnit, SampleSpec
from ninfer_jax.engine.sequence import Sequence, Status
from ninfer_jax.errors import InternalError

log = logging.getLogger("ninfer_jax.engine.scheduler")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One round of work: exactly one of `prefill` / `decode` is set."""

    seqs: tuple[Sequence, ...]
    prefill: PrefillUnit | None = None
    decode: tuple[DecodeRow, ...] = ()


class Scheduler:
    def __init__(self, config: EngineConfig, pool: PagePool, *, page_size: int,
                 max_batch: int, eos_ids: Iterable[int] = (),
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.pool = pool
        self.page_size = page_size
        self.max_batch = min(max_batch, config.max_concurrency)
        self.clock = clock
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.resident: list[Sequence] = []  # sorted by seq_id: [0] is the oldest
        self.paused: list[Sequence] = []  # sorted by seq_id: restore order
        self.cache = PrefixCache(pool, page_size) if config.prefix_reuse else None
        self.life = Lifecycle(pool, clock, eos_ids, config.max_context)
        self.counters = self.life.counters
        self._next_seq_id = 0
        self._decode_credit = 0.0  # seconds of decode owed to running streams
        self._contended = False  # the last plan had both prefill and decode work waiting
        self._paused_now: set[int] = set()

    # ------------------------------------------------------------------ intake and controls

    def add(self, handle: RequestHandle) -> Sequence:
        request = handle.request
        seq = Sequence(self._next_seq_id, handle, list(request.prompt_ids),
                       len(request.prompt_ids))
        self._next_seq_id += 1
        self.waiting.append(seq)
        return seq

    def has_work(self) -> bool:
        return bool(self.waiting or self.resident or self.paused)

    def next_deadline(self) -> float | None:
        return min((self._deadline(s) for s in self.waiting), default=None)

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

    def schedule(self) -> Schedule | None:
        self._paused_now: set[int] = set()  # never restore within the round that paused it
        while True:
            self._admit()
            if not self.resident:
                return None
            planned = self._plan()
            if planned is not None:
                return planned

    def _plan(self) -> Schedule | None:
        """None when a reservation paused or ended the chosen work (the caller re-plans)."""
        prefill_seq = next((s for s in self.resident if s.needs_prefill), None)
        has_decode = any(s.is_decode_ready for s in self.resident)
        if prefill_seq is None and not has_decode:
            # Every resident either lacks KV for several tokens or for exactly its last one;
            # anything else is a bug, and re-planning would spin forever.
            raise RuntimeError("scheduler invariant broken: a resident has nothing to run")
        self._contended = prefill_seq is not None and has_decode
        if not self._contended:
            self._decode_credit = 0.0  # no contention: nothing owed either way
        if prefill_seq is not None and (not has_decode or self._decode_credit <= 0):
            return self._plan_prefill(prefill_seq)
        return self._plan_decode()

    def _plan_prefill(self, seq: Sequence) -> Schedule | None:
        start = seq.num_computed
        end = min(seq.prefill_target, start + self.config.prefill_chunk)
        if not self._reserve(seq, end):
            return None
        sample = None
        if end == len(seq.tokens) and seq.num_output == 0 and seq.request.max_tokens > 0:
            sample = self._sample_spec(seq)
        unit = PrefillUnit(seq_id=seq.seq_id, tokens=np.asarray(seq.tokens[start:end], np.int32),
                           start=start, page_table=self._page_table(seq),
                           sample=sample)
        return Schedule(seqs=(seq,), prefill=unit)

    def _plan_decode(self) -> Schedule | None:
        ready = [s for s in self.resident if s.is_decode_ready][: self.max_batch]
        for seq in ready:  # oldest first: a reservation only ever pauses younger ones
            if seq.status is Status.RESIDENT:
                self._reserve(seq, len(seq.tokens))
        batch = tuple(s for s in ready if s.status is Status.RESIDENT)
        if not batch:
            return None
        rows = tuple(DecodeRow(seq_id=s.seq_id, token=s.tokens[-1], position=len(s.tokens) - 1,
                               page_table=self._page_table(s),
                               sample=self._sample_spec(s)) for s in batch)
        return Schedule(seqs=batch, decode=rows)

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
        params = seq.request.sampling
        # Committed output only matters to the penalties; skip the copy otherwise.
        uses_output = params.presence_penalty != 0 or params.frequency_penalty != 0
        return SampleSpec(params=params, sample_index=seq.num_output,
                          output_ids=tuple(seq.output_ids) if uses_output else ())

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
            victim = self.resident[-1]
            if victim is self.resident[0]:
                # Alone and still short: the sequence outgrew the whole pool.
                self._end(seq, "length")
                return False
            self._pause(victim)
            if victim is seq:
                return False

    def _pause(self, seq: Sequence) -> None:
        self.resident.remove(seq)
        if seq.num_computed == seq.computed_at_restore:
            seq.restore_gate = self._num_ended() + 1  # wait until something ends
        self.life.pause(seq)
        self._paused_now.add(seq.seq_id)
        seq.cache_cursor = (0, ROOT)
        bisect.insort(self.paused, seq, key=lambda s: s.seq_id)

    # ------------------------------------------------------------------ admission

    def _admit(self) -> None:
        while len(self.resident) < self.config.max_concurrency:
            oldest_paused = self.paused[0] if self.paused else None
            if (oldest_paused is not None and oldest_paused.seq_id not in self._paused_now
                    and (not self.resident or self._num_ended() >= oldest_paused.restore_gate)
                    and self._fits(oldest_paused, headroom=len(self.resident))):
                seq = self.paused.pop(0)
                self.life.restore(seq, self._reuse_cached(seq))
                seq.computed_at_restore = seq.num_computed
            else:
                seq = self._pick_waiting()
                if seq is None:
                    return
                self.life.admit(seq, self._reuse_cached(seq))
            bisect.insort(self.resident, seq, key=lambda s: s.seq_id)

    def _pick_waiting(self) -> Sequence | None:
        if not self.waiting:
            return None
        head = self.waiting[0]
        if self._fits(head):
            return self.waiting.popleft()
        if head.times_bypassed >= self.config.max_bypass:
            return None  # strict FIFO until the head gets in
        for seq in list(self.waiting)[1:]:
            if self._fits(seq):
                head.times_bypassed += 1
                self.waiting.remove(seq)
                return seq
        return None

    def _reuse_cached(self, seq: Sequence) -> int:
        """Attach the cached pages of `seq`'s longest known prefix; returns the tokens they
        cover. At least one token is always left to compute (it yields the next sample)."""
        if self.cache is None:
            return 0
        pages, last_node = self.cache.match(seq.tokens, self._max_cached_pages(seq))
        seq.pages = pages
        seq.cache_cursor = (len(pages), last_node)
        return len(pages) * self.page_size

    def _max_cached_pages(self, seq: Sequence) -> int:
        return (len(seq.tokens) - 1) // self.page_size

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
                seq.tokens, self._max_cached_pages(seq))
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

    def postprocess(self, schedule: Schedule, sampled, elapsed: float) -> None:
        """Apply a round's results: `sampled` holds one token per decode row, or the prefill's
        sampled token (ignored when the unit did not sample); `elapsed` is the step's time."""
        if schedule.prefill is not None:
            seq, unit = schedule.seqs[0], schedule.prefill
            if self._contended:
                self._decode_credit += self.config.decode_share * elapsed
            self.counters.prefill_seconds += elapsed
            self.life.computed(seq, len(unit.tokens), is_prefill=True)
            self._publish_prefix(seq)
            if unit.sample is not None:
                self._commit(seq, int(sampled[0]), from_decode=False)
            elif seq.num_output == 0 and not seq.needs_prefill:
                self._end(seq, "length")  # max_tokens 0: prompt processed, nothing to sample
            return
        if self._contended:
            self._decode_credit -= elapsed
        self.counters.record_decode(len(schedule.seqs), elapsed)
        for seq, token in zip(schedule.seqs, sampled):
            self.life.computed(seq, 1, is_prefill=False)
            self._publish_prefix(seq)
            self._commit(seq, int(token), from_decode=True)

    def _publish_prefix(self, seq: Sequence) -> None:
        if self.cache is not None:
            seq.cache_cursor = self.cache.publish(seq.tokens, seq.pages, seq.num_computed,
                                                  seq.cache_cursor)

    def _commit(self, seq: Sequence, token: int, *, from_decode: bool) -> None:
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

    # ------------------------------------------------------------------ endings

    def _detach(self, seq: Sequence) -> None:
        for group in (self.resident, self.paused):
            if seq in group:
                group.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)

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
        }

    def page_holders(self) -> list[list[int]]:
        """Every page list that holds references (for PagePool.check)."""
        holders = [s.pages for s in self.resident + self.paused + list(self.waiting)]
        if self.cache is not None:
            holders.append(self.cache.pages())
        return holders
