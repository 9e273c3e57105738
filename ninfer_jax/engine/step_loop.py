"""StepLoop: launch step n+1, then collect step n, so the host plans while the device runs.

One `advance()` asks the scheduler for the next plan and launches it before it waits for the
step already in flight; the runner's steps run on the device in launch order, so the new
step's rows can read the tokens the previous one sampled (`DecodeRow.from_previous`) before
the host has seen them. At most one step is in flight when planning starts. When the
scheduler cannot plan ahead (a sequence in flight would have to be paused, or nothing else
can run until its tokens arrive) the loop collects first. A launch whose page copies ran out
of memory dispatched nothing: the scheduler repairs what relied on them and plans again.

Step time for the metrics: a step's device time is taken as the span from the later of its
launch and the previous collect to its own collect, which is what the device spent on it
while the loop keeps it busy. Used by the engine thread (engine.py) and by tests that drive
the scheduler round by round with the fake runner.

A plan plus launch that takes SLOW_SUBMIT_S or more stalls every stream (a step is 5-20 ms
on a GPU): it is logged with how it split between planning, launching and the garbage
collector (GcClock, installed by the engine core) and XLA compiling on the engine thread
(compile_clock.py, installed by the JaxRunner: a jitted helper meeting a shape warm-up did
not compile), at most once per SLOW_LOG_PERIOD_S, so that a live run names the steps behind
a large program_submit (run 40: 14-27 ms a round at 64 streams on the H100, 0.5 ms of it
planning and packing). Compiles inside launches are also counted (`launch_compiles`,
`launch_compile_seconds`).
"""
from __future__ import annotations

import gc
import logging
import time
from typing import Callable

from ninfer_jax.engine.compile_clock import COMPILE_CLOCK
from ninfer_jax.engine.runner_api import PageCopyError, StepPlan, StepRunner
from ninfer_jax.engine.scheduler import NEEDS_SYNC, Scheduler

log = logging.getLogger("ninfer_jax.engine")

SLOW_SUBMIT_S = 0.1
SLOW_LOG_PERIOD_S = 5.0


def _describe_chunks(plan: StepPlan) -> str:
    """The slow-submit line's chunks: ' and a 512-token chunk', ' and 3 chunks of 1200
    tokens' (every chunk of the step, StepPlan.chunks) or ''."""
    chunks = plan.chunks
    if len(chunks) == 1:
        return f" and a {len(chunks[0].tokens)}-token chunk"
    if chunks:
        return f" and {len(chunks)} chunks of {sum(len(u.tokens) for u in chunks)} tokens"
    return ""


class GcClock:
    """Seconds the garbage collector has run in this process since `install()` (gc.callbacks;
    the collector holds the GIL, so every thread waits for it)."""

    def __init__(self):
        self.seconds = 0.0
        self._started = 0.0

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


GC_CLOCK = GcClock()


class StepLoop:
    def __init__(self, scheduler: Scheduler, runner: StepRunner,
                 clock: Callable[[], float] = time.perf_counter, overlap: bool = True):
        self.scheduler = scheduler
        self.runner = runner
        self.clock = clock
        self.overlap = overlap  # False: collect each step before planning the next (tests)
        self._in_flight: tuple[StepPlan, object, float] | None = None
        self._last_collect = clock()
        self.on_step: Callable[[StepPlan], None] | None = None  # tests record plans
        self._slow_logged_at = -SLOW_LOG_PERIOD_S
        self._slow_unlogged = 0  # slow submits since the last line

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def advance(self) -> bool:
        """Plan, launch and collect what is due; False when there was nothing to do."""
        started, gc_before, compiles_before = self.clock(), GC_CLOCK.seconds, COMPILE_CLOCK.here()
        plan = self.scheduler.schedule()
        planned = self.clock()
        if plan is None or plan is NEEDS_SYNC:
            self._host("program_submit", started)
            if self._in_flight is None:
                return False
            self._collect()
            return True
        try:
            handle = self.runner.launch(plan)
        except PageCopyError as error:
            self.scheduler.copies_failed(error)
            self._host("program_submit", started)
            return True
        self.scheduler.launched(plan)
        if self.on_step is not None:
            self.on_step(plan)
        launched = self._host("program_submit", started)
        kind = ("mixed" if plan.rows else "prefill") if plan.chunk is not None else "decode"
        counters = self.scheduler.counters
        counters.launches[kind] += 1
        counters.launch_seconds[kind] += launched - planned
        compiles, compiling = (now - before for now, before in
                               zip(COMPILE_CLOCK.here(), compiles_before))
        counters.launch_compiles += compiles
        counters.launch_compile_seconds += compiling
        if launched - started >= SLOW_SUBMIT_S:
            self._slow_submit(plan, planned - started, launched - planned,
                              GC_CLOCK.seconds - gc_before, compiling, launched)
        if self._in_flight is not None:
            self._collect()
        self._in_flight = (plan, handle, launched)
        if not self.overlap:
            self._collect()
        return True

    def _slow_submit(self, plan: StepPlan, planning: float, launching: float,
                     collecting: float, compiling: float, now: float) -> None:
        if now - self._slow_logged_at < SLOW_LOG_PERIOD_S:
            self._slow_unlogged += 1
            return
        chunk = _describe_chunks(plan)
        more = (f"; {self._slow_unlogged} more since the last such line"
                if self._slow_unlogged else "")
        log.info("slow step submit: %.0f ms (planning %.1f ms, launching %.1f ms; garbage "
                 "collection %.1f ms, compiling %.1f ms of it) for %d rows%s%s",
                 1e3 * (planning + launching), 1e3 * planning, 1e3 * launching,
                 1e3 * collecting, 1e3 * compiling, len(plan.rows), chunk, more)
        self._slow_logged_at, self._slow_unlogged = now, 0

    def _host(self, phase: str, since: float) -> float:
        now = self.clock()
        self.scheduler.counters.host_work[phase] += now - since
        return now

    def drain(self) -> None:
        """Collect the step in flight, if any."""
        if self._in_flight is not None:
            self._collect()

    def _collect(self) -> None:
        plan, handle, launched_at = self._in_flight
        self._in_flight = None
        counters = self.scheduler.counters
        waiting = self.clock()
        self.runner.wait(handle)
        now = self.clock()
        counters.device_wait_seconds += now - waiting
        result = self.runner.collect(handle)
        if len(result.row_tokens) != len(plan.rows):
            raise RuntimeError(f"runner returned {len(result.row_tokens)} tokens for "
                               f"{len(plan.rows)} rows")
        read = self._host("program_post", now)
        seconds = now - max(launched_at, self._last_collect)
        self._last_collect = now
        self.scheduler.postprocess(plan, result, seconds)
        self._host("engine_commit_output", read)
