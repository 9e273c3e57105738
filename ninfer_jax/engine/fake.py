"""FakeRunner: a deterministic StepRunner without JAX, for engine and server tests.

Its "KV cache" is an int array [P, S] holding the token id written at each page slot, so it
behaves like the real cache: a step writes its tokens through the page table and computes the
next token from the context it *reads back through the page table*. A wrong page table, a page
freed while still in use, or a replay that rebuilds the wrong tokens therefore changes the
output, exactly as it would with a model.

Default next token, checkable by hand: with context tokens t_0..t_p (position p is the token
being processed),
    greedy:   next = (sum_i (i + 1) * t_i) mod vocab_size
    sampled:  next = (greedy + 7919 * seed + 104729 * sample_index) mod vocab_size
so a seeded row depends only on its own context, seed and sample index, never on its batch.
Pass `next_token=` to script other behaviour (see `scripted`).

State slots (hybrid models), with `state_slot_capacity=N`: the device also holds N + 1 slot
states (slot 0 the dummy). A chunk at start 0 resets its slot to the zero state; every token a
chunk or row feeds through a slot folds into it (`fold_state`), and the next token adds the
slot's state to the formula above:
    hybrid:   next = (formula + state(t_0..t_p)) mod vocab_size
where state(...) is `state_of(tokens)`. A plan's `state_copies` copy slot states, in order,
before its step runs (state checkpoints; among them a StateCopy saves a slot's state to
`host_state` or loads it back, keeping it until a drop: pause by snapshot, spilled
checkpoints); its `page_copies` (host tier) save pages
to and load them from `host_kv` before that. As on the real model the state is not a function of
the KV pages, so a sequence that runs on a wrong or stale slot, shares one, or continues
mid-prompt on a fresh slot (a replay that skips position 0) produces different tokens.

Presence/frequency penalties, as on the real runner (engine/penalty_lanes.py): the device
holds output counts per penalty lane ([max_batch + 1, vocab], lane 0 the dummy), a plan's
`penalty_loads` set lanes from a committed output before its step (before its copies fail,
too), and every step counts each row's sample in the row's lane. A row with penalties adds
what its lane's counts say to the formula above:
    penalised: next = (formula + F + P) mod vocab_size
F = sum over the counted tokens t of (t + 1) when frequency_penalty is not 0, P = 7 * the
number of distinct counted tokens when presence_penalty is not 0. So a lane that missed a
token, counted a dropped one or was not reloaded changes the output, as it would the
model's; a penalised row on the dummy lane fails loudly.

Token policies, as on the real runner (engine/policy_lanes.py): each lane also holds a
token-policy automaton row (`policy_table`, set by the same loads), and every row's token,
each chunk's too, goes through its lane's automaton (model/token_automaton.py `advance`, the
function the step runs) before it is counted and returned.

Dispatch is asynchronous, like JAX's: `launch` queues the step for a "device" thread and
returns at once; the device runs steps strictly in launch order (sleeping `prefill_sleep` /
`decode_sleep` per step to model their cost) and `collect` waits for one step's samples. A
row that names the previous step's output (`from_previous`) reads it there, on the device
side, exactly as the compiled step does. `async_dispatch=False` runs each step inside
`launch` instead (same results, for tests that want the step on their own thread).

Chunk segments, with `chunk_segments=N` (N > 1): a plan may carry up to N chunks of different
sequences (`StepPlan.more_chunks`), each of at most `segment_tokens` tokens when there are
several, as the JaxRunner's segmented chunk shapes take them; each runs as the single chunk
does and its sample is returned in `StepResult.more_chunk_tokens`. A plan over those limits,
or with more chunks on a runner of one segment, is refused at launch.

`copy_fault(copy) -> bool` makes page copies run out of memory at launch, as the JaxRunner's
do at dispatch (page_store.py): the step is not run, the plan's other copies are, and launch
raises PageCopyError; a load from a slot whose save failed fails too.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
import weakref
from typing import Callable, Sequence

import numpy as np

from ninfer_jax.engine.host_pages import DROP, LOAD, SAVE, PageCopy, StateCopy
from ninfer_jax.engine.pages import DUMMY_PAGE
from ninfer_jax.model import token_automaton
from ninfer_jax.engine.runner_api import (
    DecodeRow, PageCopyError, PrefillUnit, SampleSpec, StepPlan, StepResult, chunk_index,
)

NextToken = Callable[[np.ndarray, SampleSpec], int]
EMPTY_SLOT = -1
STATE_MODULUS = 2**31 - 1  # fake recurrent state: a rolling hash of the tokens fed


def fold_state(state: int, token: int) -> int:
    """The fake recurrent state after feeding `token` to `state` (the zero state is 0)."""
    return (state * 1000003 + int(token) + 1) % STATE_MODULUS


def state_of(tokens) -> int:
    """The fake state after feeding `tokens` from the zero state."""
    state = 0
    for token in tokens:
        state = fold_state(state, token)
    return state


def penalty_shift(output_ids, params) -> int:
    """What a penalised row adds to the fake formula (module docstring), from the output
    counted so far: the tests' reference; the fake device computes it from its counts."""
    shift = 0
    if params.frequency_penalty:
        shift += sum(int(t) + 1 for t in output_ids)
    if params.presence_penalty:
        shift += 7 * len(set(output_ids))
    return shift


def weighted_sum_next_token(vocab_size: int) -> NextToken:
    def next_token(context: np.ndarray, sample: SampleSpec) -> int:
        weights = np.arange(1, len(context) + 1, dtype=np.int64)
        greedy = int((weights * context).sum() % vocab_size)
        params = sample.params
        if params.is_greedy:
            return greedy
        return (greedy + 7919 * params.seed + 104729 * sample.sample_index) % vocab_size
    return next_token


def scripted(script: Sequence[int], end_token: int) -> NextToken:
    """Output `script` in order whatever the prompt, then `end_token` forever."""
    def next_token(context: np.ndarray, sample: SampleSpec) -> int:
        index = sample.sample_index
        return int(script[index]) if index < len(script) else end_token
    return next_token


class _Launched:
    """A step queued on the fake device; `done` is set once its samples exist."""

    def __init__(self, plan: StepPlan, copies_only: bool = False):
        self.plan = plan
        self.copies_only = copies_only  # a failed launch's copies: no step, no samples
        self.done = threading.Event()
        self.result: StepResult | None = None
        self.error: BaseException | None = None


class FakeRunner:
    def __init__(self, *, num_pages: int = 64, page_size: int = 4, max_batch: int = 8,
                 vocab_size: int = 1000, next_token: NextToken | None = None,
                 prefill_sleep: float = 0.0, decode_sleep: float = 0.0,
                 warmup_sleep: float = 0.0, warmup_gate=None, fail_at_step: int | None = None,
                 async_dispatch: bool = True, state_slot_capacity: int = 0,
                 max_chunk_rows: int | None = None, accepts_media: bool = False,
                 copy_fault: Callable[[PageCopy], bool] | None = None,
                 chained_rows: bool = False, penalty_lanes: int | None = None,
                 chunk_segments: int = 1, segment_tokens: int = 64):
        self.page_size = page_size
        # Speculation on a hybrid: consecutive rows on one slot chain, as JaxRunner's do.
        self.chained_rows = chained_rows and bool(state_slot_capacity)
        # True: a request's media (GenerationRequest.media) is taken and its placeholder
        # tokens run as plain tokens (serve tests of media intake; no vision tower here).
        self.accepts_media = accepts_media
        self.num_pages = num_pages
        self.max_batch = max_batch
        # Rows a step with a chunk may carry (JaxRunner compiles fewer chunk shapes on CPU).
        self.max_chunk_rows = max_chunk_rows or max_batch
        # Chunks per step, and each one's most tokens in a step with several.
        self.chunk_segments = chunk_segments
        self.segment_tokens = segment_tokens
        self.vocab_size = vocab_size
        self.next_token = next_token or weighted_sum_next_token(vocab_size)
        self.prefill_sleep = prefill_sleep  # seconds per step that carries a prefill chunk
        self.decode_sleep = decode_sleep  # seconds per step of decode rows only
        self.warmup_sleep = warmup_sleep
        self.warmup_gate = warmup_gate  # a threading.Event warm-up waits for (tests)
        self.fail_at_step = fail_at_step  # raise once `steps` holds this many records
        self.async_dispatch = async_dispatch
        self.copy_fault = copy_fault
        self._lost_slots: set[int] = set()  # failed saves, until their slot is dropped
        self._copy_error: BaseException | None = None  # of a failed launch's copies
        self.kv = np.full((num_pages, page_size), EMPTY_SLOT, np.int64)
        self.penalty_lanes = max_batch if penalty_lanes is None else penalty_lanes
        self.penalty_counts = np.zeros((self.penalty_lanes + 1, vocab_size), np.int64)
        self.policy_table = np.zeros((self.penalty_lanes + 1, token_automaton.ROW_WIDTH),
                                     np.int32)
        # The host tier: slot -> a saved copy of one page, kept through loads until a drop;
        # a missing copy, or a save into a held slot, fails loudly.
        self.host_kv: dict[int, np.ndarray] = {}
        self.page_bytes = 8 * page_size  # one int64 token id per slot
        # Usable state slots (0: a dense model); `state[s]` is slot s's state on the device.
        self.state_slot_capacity = state_slot_capacity
        self.state = np.zeros(state_slot_capacity + 1 if state_slot_capacity else 0, np.int64)
        # State snapshots in the host tier: ticket -> a slot's state. A fake state is "worth"
        # two pages of the host budget, so the budget's reservation path is exercised.
        self.host_state: dict[int, int] = {}
        self.state_bytes = 2 * self.page_bytes if state_slot_capacity else 0
        # One record per executed unit: ("prefill", seq_id, start, T) / ("decode", seq ids)
        self.steps: list[tuple] = []
        self.plans: list[StepPlan] = []  # every launched plan, in order
        self.is_warm = False
        self._previous: StepResult | None = None  # device side: the last step's samples
        self._queue: "queue.Queue[_Launched]" = queue.Queue()
        self._device: threading.Thread | None = None

    def warmup(self) -> None:
        if self.warmup_gate is not None:
            self.warmup_gate.wait()
        time.sleep(self.warmup_sleep)
        self.is_warm = True

    def compile_progress(self) -> tuple[int, int]:
        return (1 if self.is_warm else 0), 1

    def prime_one(self) -> bool:
        return False  # nothing here pays a first-run cost

    # ------------------------------------------------------------------ launch / collect

    def clear_host_pages(self) -> None:
        self.host_kv.clear()
        self._lost_slots.clear()
        self.host_state.clear()

    def _host_state(self, copy: StateCopy) -> None:
        if copy.kind == "save":
            self._check_slot(copy.state_slot)
            if copy.ticket in self.host_state:
                raise AssertionError(f"state ticket {copy.ticket} saved while held")
            self.host_state[copy.ticket] = int(self.state[copy.state_slot])
        elif copy.kind == "load":  # the row stays until its drop, as a page's does
            self._check_slot(copy.state_slot)
            self.state[copy.state_slot] = self.host_state[copy.ticket]
        else:
            del self.host_state[copy.ticket]

    def launch(self, plan: StepPlan) -> _Launched:
        if len(plan.rows) > self.max_batch:
            raise ValueError(f"step of {len(plan.rows)} rows (max {self.max_batch})")
        if plan.chunk is not None and len(plan.rows) > self.max_chunk_rows:
            raise ValueError(f"chunk step of {len(plan.rows)} rows "
                             f"(max {self.max_chunk_rows})")
        self._check_chunks(plan)
        plan, error = self._screen_copies(plan)
        if error is not None:
            self._dispatch(_Launched(plan, copies_only=True))
            raise error
        self.plans.append(plan)
        return self._dispatch(_Launched(plan))

    def _check_chunks(self, plan: StepPlan) -> None:
        """Refuse the chunks a runner of `chunk_segments` segments cannot take in one step."""
        if plan.more_chunks and plan.chunk is None:
            raise ValueError("a plan with more_chunks lacks its first chunk")
        chunks = plan.chunks
        if len(chunks) > self.chunk_segments:
            raise ValueError(f"step of {len(chunks)} chunks (max {self.chunk_segments})")
        if len(chunks) < 2:
            return
        if len({unit.seq_id for unit in chunks}) < len(chunks):
            raise ValueError("a step carries two chunks of one sequence")
        for unit in chunks:
            if len(unit.tokens) > self.segment_tokens:
                raise ValueError(f"a {len(unit.tokens)}-token chunk among {len(chunks)} "
                                 f"(max {self.segment_tokens} tokens a segment)")
            if unit.media is not None:
                raise ValueError("a chunk with media shares a step")

    def _dispatch(self, launched: _Launched) -> _Launched:
        if not self.async_dispatch:
            self._execute(launched)
            return launched
        if self._device is None:
            self._device = threading.Thread(target=_device_loop, name="fake-device",
                                            args=(weakref.ref(self), self._queue), daemon=True)
            self._device.start()
        self._queue.put(launched)
        return launched

    def _screen_copies(self, plan: StepPlan) -> tuple[StepPlan, PageCopyError | None]:
        """The plan without the page copies that run out of memory (`copy_fault`), and the
        error they raise; drops of slots whose save failed have no bytes to drop."""
        if self.copy_fault is None and not self._lost_slots:
            return plan, None
        kept, lost, failed = [], set(), set()
        for copy in plan.page_copies:
            if copy.host_slot in self._lost_slots:
                if copy.kind == DROP:
                    self._lost_slots.discard(copy.host_slot)
                    continue
                if copy.kind == LOAD:
                    failed.add(copy.device_page)
                    continue
            if copy.kind != DROP and self.copy_fault is not None and self.copy_fault(copy):
                if copy.kind == SAVE:
                    lost.add(copy.host_slot)
                else:
                    failed.add(copy.device_page)
                continue
            kept.append(copy)
        self._lost_slots |= lost
        plan = dataclasses.replace(plan, page_copies=tuple(kept))
        if not (lost or failed):
            return plan, None
        return plan, PageCopyError(frozenset(lost), frozenset(failed), "fake out of memory")

    def wait(self, launched: _Launched) -> None:
        launched.done.wait()

    def collect(self, launched: _Launched) -> StepResult:
        launched.done.wait()
        if self._copy_error is not None:  # nobody collects a failed launch: report it here
            raise self._copy_error
        if launched.error is not None:
            raise launched.error
        return launched.result

    def _execute(self, launched: _Launched) -> None:
        try:
            if launched.copies_only:
                self._apply_copies(launched.plan)
            else:
                launched.result = self._run(launched.plan)
        except BaseException as exc:  # surfaces in collect, as a device error would
            launched.error = exc
            if launched.copies_only:
                self._copy_error = exc
        launched.done.set()

    def _run(self, plan: StepPlan) -> StepResult:
        if self.fail_at_step is not None and len(self.steps) >= self.fail_at_step:
            raise RuntimeError("fake device failure")
        sleep = self.prefill_sleep if plan.chunk is not None else self.decode_sleep
        if sleep:
            time.sleep(sleep)
        self._apply_copies(plan)
        chunk_tokens = [self._prefill(unit) for unit in plan.chunks]
        rows = np.empty(len(plan.rows), np.int32)
        if plan.rows:
            self.steps.append(("decode", tuple(r.seq_id for r in plan.rows)))
        # Every row writes its KV before any row reads (one step, as on the device).
        tokens = [self._row_token(row) for row in plan.rows]
        for row, token in zip(plan.rows, tokens):
            self._write(row.page_table, row.position, token)
        if self.chained_rows:
            self._chained_rows(plan.rows, tokens, rows)
        else:
            for row, token in zip(plan.rows, tokens):
                self._feed(row.state_slot, [token])
            for i, row in enumerate(plan.rows):
                rows[i] = self._next(self._read(row.page_table, row.position + 1),
                                     row.sample, row.state_slot)
        chunk_forced = self._settle_chunks(plan.chunks, chunk_tokens)
        forced = np.zeros(len(plan.rows), bool)
        for i, row in enumerate(plan.rows):
            rows[i], forced[i] = self._apply_policy(row.sample, rows[i])
            self._count(row.sample, rows[i])
        result = StepResult(chunk_token=chunk_tokens[0] if chunk_tokens else None,
                            row_tokens=rows, chunk_forced=bool(chunk_forced and chunk_forced[0]),
                            row_forced=forced if forced.any() else None,
                            more_chunk_tokens=tuple(chunk_tokens[1:]),
                            more_chunk_forced=tuple(chunk_forced[1:]))
        self._previous = result
        return result

    def _settle_chunks(self, chunks, tokens: list) -> list[bool]:
        """Every chunk's sample through its lane's policy, then counted, as a row's (in
        place); returns which ones a rule forced."""
        forced = [False] * len(chunks)
        for k, unit in enumerate(chunks):
            if unit.sample is not None:
                tokens[k], forced[k] = self._apply_policy(unit.sample, tokens[k])
                self._count(unit.sample, tokens[k])
        return forced

    def _chained_rows(self, plan_rows, tokens, rows) -> None:
        """Rows on the same slot as the row before them continue its state; each slot then
        keeps the state after its chain's last row whose fed draft was accepted and whose
        sample was not (model/hybrid.py `settle_rows`)."""
        states, final = [], {}
        for i, (row, token) in enumerate(zip(plan_rows, tokens)):
            self._check_slot(row.state_slot)
            chained = i > 0 and plan_rows[i - 1].state_slot == row.state_slot
            start = states[-1] if chained else int(self.state[row.state_slot])
            states.append(fold_state(start, token))
            rows[i] = (self.next_token(self._read(row.page_table, row.position + 1),
                                       row.sample) + states[-1]) % self.vocab_size
            if not chained or final.get(row.state_slot) == i - 1 and \
                    rows[i - 1] == token:
                final[row.state_slot] = i
        for slot, i in final.items():
            self.state[slot] = states[i]

    def _apply_copies(self, plan: StepPlan) -> None:
        for load in plan.penalty_loads:
            self._check_lane(load.lane)
            self.penalty_counts[load.lane] = np.bincount(
                np.asarray(load.output_ids, np.int64), minlength=self.vocab_size)
            self.policy_table[load.lane] = 0 if load.policy is None else load.policy
        for copy in plan.page_copies:  # as HostPageStore: a slot holds one page or nothing
            if copy.kind == SAVE:
                if copy.host_slot in self.host_kv:
                    raise AssertionError(f"host slot {copy.host_slot} saved while held")
                self.host_kv[copy.host_slot] = self.kv[copy.device_page].copy()
            elif copy.kind == LOAD:
                self.kv[copy.device_page] = self.host_kv[copy.host_slot]
            else:
                del self.host_kv[copy.host_slot]
        for copy in plan.state_copies:
            if isinstance(copy, StateCopy):
                self._host_state(copy)
                continue
            src, dst = copy
            self._check_slot(src)
            self._check_slot(dst)
            self.state[dst] = self.state[src]

    def _row_token(self, row: DecodeRow) -> int:
        if row.from_previous is None:
            return int(row.token)
        previous = self._previous
        if previous is None:
            raise AssertionError("a row reads the previous step's output, but none ran")
        if row.from_previous < 0:
            index = chunk_index(row.from_previous)
            if index > len(previous.more_chunk_tokens):
                raise AssertionError(f"a row reads chunk {index}'s sample; the previous step "
                                     f"had {len(previous.more_chunk_tokens) + 1} chunks")
            token, _ = previous.chunk_sample(index)
            if token is None:
                raise AssertionError("a row reads a chunk sample the previous step lacks")
            return int(token)
        return int(previous.row_tokens[row.from_previous])

    def _prefill(self, unit: PrefillUnit) -> int | None:
        self.steps.append(("prefill", unit.seq_id, unit.start, len(unit.tokens)))
        for offset, token in enumerate(unit.tokens):
            self._write(unit.page_table, unit.start + offset, int(token))
        if self.state_slot_capacity and unit.start == 0:
            self._check_slot(unit.state_slot)
            self.state[unit.state_slot] = 0  # a sequence's first chunk starts from zero
        self._feed(unit.state_slot, unit.tokens)
        if unit.sample is None:
            return None
        end = unit.start + len(unit.tokens)
        return self._next(self._read(unit.page_table, end), unit.sample, unit.state_slot)

    # ------------------------------------------------------------------ fake penalty lanes

    def _penalty(self, sample: SampleSpec) -> int:
        params, lane = sample.params, sample.penalty_lane
        if not (params.presence_penalty or params.frequency_penalty):
            return 0
        self._check_lane(lane)
        counts = self.penalty_counts[lane]
        shift = 0
        if params.frequency_penalty:
            shift += int((counts * np.arange(1, self.vocab_size + 1)).sum())
        if params.presence_penalty:
            shift += 7 * int((counts > 0).sum())
        return shift

    def _apply_policy(self, sample: SampleSpec, token: int) -> tuple[int, bool]:
        """The lane's token-policy automaton on the sample, as the step applies it:
        (the token committed, whether a rule forced it)."""
        lane = np.int32([sample.penalty_lane])
        emitted, node, counter, forced = token_automaton.advance(
            np, self.policy_table, lane, np.int32([token]), np.int32([sample.sample_index]))
        if sample.penalty_lane:
            self.policy_table[lane[0], :2] = node[0], counter[0]
        return int(emitted[0]), bool(forced[0])

    def _count(self, sample: SampleSpec, token: int) -> None:
        if sample.penalty_lane:
            self.penalty_counts[sample.penalty_lane, int(token)] += 1

    def _check_lane(self, lane: int) -> None:
        if not 0 < lane <= self.penalty_lanes:
            raise AssertionError(f"a penalised row or load uses penalty lane {lane} "
                                 f"(usable 1..{self.penalty_lanes})")

    # ------------------------------------------------------------------ fake state slots

    def _next(self, context: np.ndarray, sample: SampleSpec, slot: int) -> int:
        token = (self.next_token(context, sample) + self._penalty(sample)) % self.vocab_size
        if not self.state_slot_capacity:
            return int(token)
        return int((token + int(self.state[slot])) % self.vocab_size)

    def _feed(self, slot: int, tokens) -> None:
        if not self.state_slot_capacity:
            return
        self._check_slot(slot)
        state = int(self.state[slot])
        for token in tokens:
            state = fold_state(state, token)
        self.state[slot] = state

    def _check_slot(self, slot: int) -> None:
        # Only real work reaches the fake device (it has no padding rows), so slot 0 here is
        # a sequence without a slot: the scheduler lost it.
        if not 0 < slot <= self.state_slot_capacity:
            raise AssertionError(f"real work uses state slot {slot} "
                                 f"(usable 1..{self.state_slot_capacity})")

    # ------------------------------------------------------------------ fake KV

    def _slot(self, page_table: np.ndarray, position: int) -> tuple[int, int]:
        index = position // self.page_size
        if index >= len(page_table):
            raise AssertionError(f"page table of {len(page_table)} pages misses position "
                                 f"{position}")
        page = int(page_table[index])
        if page == DUMMY_PAGE or not 0 < page < self.num_pages:
            raise AssertionError(f"real position {position} maps to page {page}")
        return page, position % self.page_size

    def _write(self, page_table: np.ndarray, position: int, token: int) -> None:
        page, slot = self._slot(page_table, position)
        self.kv[page, slot] = token

    def _read(self, page_table: np.ndarray, length: int) -> np.ndarray:
        context = np.array([self.kv[self._slot(page_table, p)] for p in range(length)])
        if (context == EMPTY_SLOT).any():
            raise AssertionError("a step read KV that was never written")
        return context


def _device_loop(runner_ref, work: queue.Queue) -> None:
    """The fake device's thread: runs launched steps in order. It holds its runner weakly and
    ends once the runner is gone, so a test suite does not keep a thread per runner."""
    while True:
        try:
            launched = work.get(timeout=0.5)
        except queue.Empty:
            if runner_ref() is None:
                return
            continue
        runner = runner_ref()
        if runner is None:
            return
        runner._execute(launched)
        del runner
