"""Helpers shared by the engine tests: requests, a synchronous driver, and the reference
output of the fake model computed without any paging (so paging bugs show as mismatches)."""
from __future__ import annotations

import itertools

import numpy as np

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.fake import FakeRunner, penalty_shift, state_of
from ninfer_jax.engine.host_pages import HostPagePool, StateCopy
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import (
    Finished, GenerationRequest, RequestHandle, SamplingParams, TERMINAL,
)
from ninfer_jax.engine.runner_api import StepPlan
from ninfer_jax.engine.scheduler import Scheduler
from ninfer_jax.engine.state_slots import StateSlotPool
from ninfer_jax.engine.step_loop import StepLoop

VOCAB = 1000
GREEDY = SamplingParams(temperature=0.0)
_ids = itertools.count()


def make_request(prompt, max_tokens=8, **fields) -> GenerationRequest:
    fields.setdefault("sampling", GREEDY)
    return GenerationRequest(request_id=f"req-{next(_ids)}", prompt_ids=list(prompt),
                             max_tokens=max_tokens, **fields)


def expected_output(prompt, max_tokens, *, sampling=GREEDY, vocab=VOCAB, stop=(),
                    forced=None, hybrid=False):
    """The fake model's output computed directly from its formula (fake.py docstring).
    `forced(output, sampled) -> list` mimics a TokenPolicy; `hybrid` adds the state term;
    penalties add theirs (fake.penalty_shift of the committed output)."""
    context = list(prompt)
    output: list[int] = []
    while len(output) < max_tokens:
        weights = np.arange(1, len(context) + 1)
        token = int((weights * np.array(context)).sum() % vocab)
        if not sampling.is_greedy:
            token = (token + 7919 * sampling.seed + 104729 * len(output)) % vocab
        token = (token + penalty_shift(output, sampling)) % vocab
        if hybrid:
            token = (token + state_of(context)) % vocab
        ids = forced(tuple(output), token) if forced else [token]
        for tok in ids:
            context.append(tok)
            output.append(tok)
            if tok in stop or len(output) >= max_tokens:
                return output
    return output


def prompt_of(length: int, salt: int = 0) -> list[int]:
    return [(7 * i + 13 * salt + 1) % VOCAB for i in range(length)]


class Driver:
    """A Scheduler, a FakeRunner and the engine's StepLoop driven round by round on the
    test's thread. With `overlap` (the engine's way) step n+1 is launched before step n is
    collected; the fake runner dispatches asynchronously like the real one."""

    def __init__(self, *, num_pages=64, page_size=4, eos_ids=(), overlap=True,
                 async_dispatch=True, state_slots=0, max_batch=8, max_chunk_rows=None,
                 next_token=None, host_pages=0, copy_fault=None, device_policies=True,
                 chunk_segments=1, segment_tokens=64, **config):
        # device_policies False: every token policy stays on the host (their oracle)
        # state_slots: usable state slots of a hybrid-like fake model (0: dense)
        self.runner = FakeRunner(num_pages=num_pages, page_size=page_size, vocab_size=VOCAB,
                                 async_dispatch=async_dispatch, state_slot_capacity=state_slots,
                                 max_batch=max_batch, max_chunk_rows=max_chunk_rows,
                                 next_token=next_token, copy_fault=copy_fault,
                                 chunk_segments=chunk_segments, segment_tokens=segment_tokens)
        self.config = EngineConfig(**config)
        self.pool = PagePool(num_pages)
        self.slots = StateSlotPool(state_slots)
        # host_pages: host tier slots (0: none), each one fake page
        self.host = HostPagePool(host_pages, self.runner.page_bytes, self.runner.state_bytes)
        self.scheduler = Scheduler(self.config, self.pool, page_size=page_size,
                                   max_batch=self.runner.max_batch, eos_ids=eos_ids,
                                   slots=self.slots, max_chunk_rows=self.runner.max_chunk_rows,
                                   host=self.host,
                                   vocab_size=VOCAB if device_policies else None,
                                   chunk_segments=chunk_segments,
                                   segment_tokens=segment_tokens)
        self.loop = StepLoop(self.scheduler, self.runner, overlap=overlap)
        self.handles: list[RequestHandle] = []
        self.schedules: list[StepPlan] = []  # every launched plan, in order
        self.loop.on_step = self.schedules.append

    def submit(self, request) -> RequestHandle:
        handle = RequestHandle(request)
        self.scheduler.add(handle)
        self.handles.append(handle)
        return handle

    def step(self) -> bool:
        """One round; False when the scheduler has nothing left to do."""
        self.scheduler.apply_controls()
        advanced = self.loop.advance()
        self.check_pages()
        if not advanced:
            return self.scheduler.has_work()
        return True

    def run(self, max_rounds=100_000) -> None:
        for _ in range(max_rounds):
            if not self.step():
                self.loop.drain()
                if not self.scheduler.has_work():
                    self.check_host_rows()
                    return
        raise AssertionError("the scheduler did not finish")

    def run_all(self, requests) -> list[Finished]:
        """Submits every request, runs until none has work, and returns each one's Finished
        in the order given."""
        handles = [self.submit(r) for r in requests]
        self.run()
        return [finished(h) for h in handles]

    def request_pages(self) -> int:
        """Pages some request still holds (pages only the prefix cache keeps excluded)."""
        cache = self.scheduler.cache
        cached = set(cache.pages()) if cache is not None else set()
        return sum(self.pool.refcount(page) > (page in cached)
                   for page in range(1, self.pool.num_pages))

    def check_host_rows(self) -> None:
        """The runner's host bytes are exactly the held slots once the queued copies apply:
        no slot the scheduler freed keeps a page alive on the host (run 24's leak)."""
        rows = set(self.runner.host_kv)
        for copy in self.host.copies:
            if copy.kind == "save":
                rows.add(copy.host_slot)
            elif copy.kind == "drop":  # a load keeps its row
                rows.discard(copy.host_slot)
        states = set(self.runner.host_state)  # state snapshots (hybrid), by ticket
        queued = self.scheduler._state_copies + (
            self.scheduler.checkpoints.copies if self.scheduler.checkpoints else [])
        for copy in queued:
            if isinstance(copy, StateCopy):
                (states.add if copy.kind == "save" else states.discard)(copy.ticket)
        reserved = self.scheduler.host_state_rows()  # snapshots' and checkpoints'
        assert states == {slots[0] for slots in reserved}
        assert rows == set(self.scheduler.host_holders()) - {
            slot for slots in reserved for slot in slots}

    def check_pages(self) -> None:
        self.pool.check(self.scheduler.page_holders())
        self.slots.check(self.scheduler.slot_holders())
        self.host.check(self.scheduler.host_holders())
        self.scheduler.penalty_lanes.check(self.scheduler.lane_holders())


def drain(handle: RequestHandle) -> list:
    """Every event published so far (non-blocking)."""
    events = []
    while (event := handle.next_event(timeout=0)) is not None:
        events.append(event)
    return events


def terminal(events):
    ends = [e for e in events if isinstance(e, TERMINAL)]
    assert len(ends) == 1, f"expected exactly one terminal event, got {ends}"
    return ends[0]


def finished(handle: RequestHandle) -> Finished:
    end = terminal(drain(handle))
    assert isinstance(end, Finished), end
    return end
