"""Lifecycle: the state transitions of one sequence, with their events and counters.

The scheduler decides *when* a sequence is admitted, paused, restored, advanced or ended;
this module does each transition completely: pages, the state slot (hybrid models), per-request
and engine counters, the handle's events (Admitted, PromptProgress, Tokens, exactly one
terminal), the pressure log and the scheduling-event listeners. Engine thread only.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Iterable

from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import (
    Admitted, Failed, Finished, PromptProgress, Tokens, Usage,
)
from ninfer_jax.engine.sequence import Sequence, Status
from ninfer_jax.engine.state_slots import DUMMY_STATE_SLOT, StateSlotPool
from ninfer_jax.engine.stats import EngineCounters
from ninfer_jax.errors import NinferError, QueueTimeout

log = logging.getLogger("ninfer_jax.engine.pressure")


class TokenPolicyError(RuntimeError):
    """A request's TokenPolicy raised: that request fails, the engine carries on."""


@dataclasses.dataclass(frozen=True)
class SchedulingEvent:
    """A pressure transition of one request, for the request log: pause_started, paused,
    restore_started, restored, replay_complete, recovery_complete, snapshot_revoked.
    `route` is "snapshot" or "replay" once the pause chose how the request comes back (None
    at pause_started). Listeners run on the engine thread: they must only enqueue."""

    kind: str
    request_id: str
    seq_id: int
    preemption_index: int  # which pause cycle (1-based)
    num_tokens: int  # prompt + committed output at the transition
    counters: dict  # the request's counters at the transition (a copy)
    time: float
    route: str | None = None


class Lifecycle:
    def __init__(self, pool: PagePool, clock: Callable[[], float], eos_ids: Iterable[int],
                 max_context: int, slots: StateSlotPool | None = None):
        self.pool = pool
        self.slots = slots if slots is not None else StateSlotPool(0)
        self.clock = clock
        self.eos_ids = frozenset(eos_ids)
        self.max_context = max_context
        self.counters = EngineCounters()
        self.listeners: list[Callable[[SchedulingEvent], None]] = []
        # Called once per sequence after its terminal event (the engine's outstanding count).
        self.on_terminal: Callable[[Sequence], None] | None = None

    # ---------------------------------------------------------------- residency

    def admit(self, seq: Sequence, cache_n: int = 0) -> None:
        now = self.clock()
        seq.status = Status.RESIDENT
        seq.admitted_at = now
        seq.cache_n = seq.num_computed = seq.high_water = cache_n
        self._take_slot(seq)
        self.counters.prompt_tokens += seq.num_prompt
        self.counters.cached_tokens += cache_n
        seq.handle.publish(Admitted(cache_n=cache_n, time=now))

    def pause_started(self, seq: Sequence) -> None:
        seq.counters["preemptions"] += 1
        self.counters.preemptions += 1
        self._emit("pause_started", seq, None)

    def pause(self, seq: Sequence, route: str = "replay") -> None:
        """Free the pages, keep the tokens (and, by route snapshot, a host copy of the KV:
        the scheduler queued it)."""
        freed = len(seq.pages)
        self.pool.release(seq.pages)
        seq.pages = []
        self._give_slot(seq)
        seq.high_water = max(seq.high_water, seq.num_computed)
        seq.num_computed = 0
        seq.status = Status.PAUSED
        seq.paused_at = self.clock()
        log.info("pause request_id=%s seq=%d output_tokens=%d pages_freed=%d preemption=%d "
                 "route=%s", seq.request_id, seq.seq_id, seq.num_output, freed,
                 seq.counters["preemptions"], route)
        self._emit("paused", seq, route)

    def restore_started(self, seq: Sequence) -> None:
        self._emit("restore_started", seq, "snapshot" if seq.snapshot is not None else "replay")

    def snapshot_revoked(self, seq: Sequence) -> None:
        """The snapshot could not come back (no device pages for it): replay instead."""
        self.counters.snapshot_revocations += 1
        self._emit("snapshot_revoked", seq, "replay")

    def restore(self, seq: Sequence, cached_tokens: int = 0, route: str = "replay") -> None:
        """Back to resident; `cached_tokens` leading tokens have KV again (from the prefix
        cache, and by route snapshot from the host copy): no replay needed for them."""
        seq.status = Status.RESIDENT
        seq.num_computed = cached_tokens
        self._take_slot(seq)
        seq.counters["paused_seconds"] += self.clock() - seq.paused_at
        seq.paused_at = None
        if route == "snapshot":
            seq.counters["snapshot_restores"] += 1
            self.counters.snapshot_restores += 1
        else:
            seq.counters["restored_cached_tokens"] += cached_tokens
            seq.counters["replay_restores"] += 1
            self.counters.replay_restores += 1
        seq.recovering = route
        log.info("restore request_id=%s seq=%d route=%s kv_tokens=%d replay_tokens=%d",
                 seq.request_id, seq.seq_id, route, cached_tokens,
                 max(0, seq.high_water - cached_tokens))
        self._emit("restored", seq, route)

    def _take_slot(self, seq: Sequence) -> None:
        """A hybrid sequence becoming resident takes a slot. Its state starts from zero at
        position 0, or from a checkpoint copied in (`state_source`) or its pause snapshot
        (`host_state`): cached pages alone cannot rebuild the recurrent state. (Draft-store
        slots of a dense model, `holds_state` False, hold nothing to rebuild.)"""
        if not self.slots.is_enabled:
            return
        if self.slots.has_state and seq.num_computed and seq.state_source is None and \
                seq.host_state is None:
            raise RuntimeError(f"seq {seq.seq_id} would take a fresh state slot at position "
                               f"{seq.num_computed}; its state must start at 0")
        seq.state_slot = self.slots.alloc()

    def _give_slot(self, seq: Sequence) -> None:
        if seq.state_slot != DUMMY_STATE_SLOT:
            self.slots.release(seq.state_slot)
            seq.state_slot = DUMMY_STATE_SLOT

    def computed(self, seq: Sequence, start: int, end: int, *, is_prefill: bool) -> None:
        """A collected step computed KV for positions [start, end) of `seq` (the scheduler
        already advanced num_computed when it launched the step)."""
        count = end - start
        replayed = max(0, min(end, seq.high_water) - start)
        fresh = count - replayed
        seq.counters["replayed_tokens"] += replayed
        self.counters.replayed_tokens += replayed
        if is_prefill:
            seq.counters["prefill_units"] += 1
            seq.counters["prefill_tokens"] += fresh
            self.counters.prefill_tokens += fresh
            self.counters.prefill_units += 1
        else:
            seq.counters["decode_rounds"] += 1
        if replayed and end >= seq.high_water:
            log.info("replay complete request_id=%s seq=%d replayed_tokens=%d",
                     seq.request_id, seq.seq_id, seq.counters["replayed_tokens"])
            self._emit("replay_complete", seq, "replay")
        seq.high_water = max(seq.high_water, end)
        processed = min(end, seq.num_prompt)
        if processed > seq.num_prompt_reported:
            seq.num_prompt_reported = processed
            seq.handle.publish(PromptProgress(processed=processed, total=seq.num_prompt,
                                              cache_n=seq.cache_n, time=self.clock()))

    def decoded(self, seq: Sequence, position: int) -> None:
        """computed(seq, position, position + 1, is_prefill=False), for a decode row: past
        the high-water mark and the prompt (the common case) only two fields change."""
        if position < seq.high_water or min(position + 1, seq.num_prompt) > \
                seq.num_prompt_reported:
            self.computed(seq, position, position + 1, is_prefill=False)
            return
        seq.counters["decode_rounds"] += 1
        seq.high_water = position + 1

    # ---------------------------------------------------------------- output

    def commit(self, seq: Sequence, sampled: int, *, from_decode: bool):
        """Commit the sampled token (through the request's TokenPolicy, unless the device
        applied it already) and publish it. Returns (reason, matched_stop_token) when the
        request must finish, else None."""
        policy = seq.request.token_policy if seq.device_policy is None else None
        try:
            ids = list(policy.adjust(tuple(seq.output_ids), sampled)) if policy else [sampled]
        except Exception as exc:  # plain Python from the HTTP side: contain it
            raise TokenPolicyError(f"token policy of {seq.request_id} failed") from exc
        if not ids:
            ids = [sampled]  # a policy may replace the sample, never swallow the round
        return self.append(seq, ids, from_decode=from_decode)[1]

    def commit_run(self, seq: Sequence, ids) -> tuple:
        """Commit a speculative round's tokens (no TokenPolicy: such requests never draft)
        up to the first that ends the request, as one Tokens event. Returns
        (number committed, finish or None)."""
        new, finish = self.append(seq, [int(t) for t in ids], from_decode=True)
        return len(new), finish

    def append(self, seq: Sequence, ids, *, from_decode: bool) -> tuple[list, tuple | None]:
        """Append `ids` up to the first that ends the request; publish them as one event.
        A token ends it when it is one of the request's stop ids or (unless ignore_eos,
        which lifts only the model's end tokens) an end token ("stop"), or when it reaches
        max_tokens or the context end ("length")."""
        request, tokens = seq.request, seq.tokens
        stops = request.stop_token_ids
        ends = () if request.ignore_eos else self.eos_ids
        limit = min(seq.num_prompt + request.max_tokens, self.max_context)
        new, finish = [], None
        for token in ids:
            tokens.append(token)
            new.append(token)
            if token in stops or token in ends:
                finish = ("stop", token)
                break
            if len(tokens) >= limit:
                finish = ("length", None)
                break
        now = self.clock()
        if seq.first_token_at is None:
            seq.first_token_at = now
        seq.last_token_at = now
        if seq.recovering is not None:  # the first fresh commit since the restore
            self._emit("recovery_complete", seq, seq.recovering)
            seq.recovering = None
        self.counters.generation_tokens += len(new)
        if from_decode:
            self.counters.decode_tokens += len(new)
        seq.handle.publish(Tokens(tuple(new), len(tokens) - seq.num_prompt, now))
        return new, finish

    def truncate_output(self, seq: Sequence, num_output: int) -> None:
        del seq.tokens[seq.num_prompt + num_output:]
        seq.num_computed = min(seq.num_computed, len(seq.tokens))

    # ---------------------------------------------------------------- endings

    def finish(self, seq: Sequence, reason: str, matched: int | None = None) -> None:
        num_pages = len(seq.pages)
        now = self._release(seq)
        if reason == "cancelled":
            log.info("cancelled request_id=%s seq=%d output_tokens=%d pages_released=%d",
                     seq.request_id, seq.seq_id, seq.num_output, num_pages)
        self.counters.requests[reason] = self.counters.requests.get(reason, 0) + 1
        usage = Usage(prompt_tokens=seq.num_prompt, cached_tokens=seq.cache_n,
                      completion_tokens=seq.num_output)
        seq.handle.publish(Finished(
            reason=reason, usage=usage, output_ids=tuple(seq.output_ids),
            timings=self._timings(seq, now), counters=_copy_counters(seq.counters), time=now,
            matched_stop_token=matched))
        self._terminal(seq)

    def queue_timeout(self, seq: Sequence) -> None:
        self.counters.requests["timeout"] += 1
        self._release(seq)
        seq.handle.publish(Failed(QueueTimeout(
            "the request was not admitted before the pending timeout"), time=self.clock()))
        self._terminal(seq)

    def fail(self, seq: Sequence, error: NinferError) -> None:
        self.counters.requests["failed"] += 1
        self._release(seq)
        seq.handle.publish(Failed(error, time=self.clock()))
        self._terminal(seq)

    def _release(self, seq: Sequence) -> float:
        now = self.clock()
        if seq.pages:
            self.pool.release(seq.pages)
            seq.pages = []
        self._give_slot(seq)
        if seq.paused_at is not None:
            seq.counters["paused_seconds"] += now - seq.paused_at
            seq.paused_at = None
        seq.status = Status.FINISHED
        return now

    def _terminal(self, seq: Sequence) -> None:
        if self.on_terminal is not None:
            self.on_terminal(seq)

    @staticmethod
    def _timings(seq: Sequence, now: float) -> dict:
        arrival = seq.request.arrival_time
        admitted = seq.admitted_at if seq.admitted_at is not None else now
        first = seq.first_token_at if seq.first_token_at is not None else now
        last = seq.last_token_at if seq.last_token_at is not None else first
        return {"queue": admitted - arrival, "prefill": first - admitted,
                "decode": last - first, "total": now - arrival}

    def _emit(self, kind: str, seq: Sequence, route: str | None) -> None:
        if not self.listeners:
            return
        event = SchedulingEvent(kind=kind, request_id=seq.request_id, seq_id=seq.seq_id,
                                preemption_index=seq.counters["preemptions"],
                                num_tokens=len(seq.tokens), counters=_copy_counters(seq.counters),
                                time=self.clock(), route=route)
        for listener in self.listeners:
            listener(event)


def _copy_counters(counters: dict) -> dict:
    """A snapshot of a sequence's counters that shares no list with the engine thread."""
    return {k: list(v) if isinstance(v, list) else v for k, v in counters.items()}
