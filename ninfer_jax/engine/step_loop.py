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
"""
from __future__ import annotations

import time
from typing import Callable

from ninfer_jax.engine.runner_api import PageCopyError, StepPlan, StepRunner
from ninfer_jax.engine.scheduler import NEEDS_SYNC, Scheduler


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

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def advance(self) -> bool:
        """Plan, launch and collect what is due; False when there was nothing to do."""
        started = self.clock()
        plan = self.scheduler.schedule()
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
        if self._in_flight is not None:
            self._collect()
        self._in_flight = (plan, handle, launched)
        if not self.overlap:
            self._collect()
        return True

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
