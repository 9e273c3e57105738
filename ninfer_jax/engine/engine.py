"""Engine: the one thread that owns the device and every scheduling structure.

Threading model: HTTP threads call `submit()` (validation and admission capacity are checked
synchronously there), `RequestHandle.cancel()/stop_at()` and `stats()`. They share only a
small inbox and a counter with the engine thread, guarded by one condition variable; the
engine thread sleeps on it when idle (no polling) and wakes on submit, cancel and stop_at.
Each round the engine thread drains the inbox, applies controls and advances the step loop
(step_loop.py: plan and launch step n+1, then collect step n and commit its tokens), then
publishes a fresh immutable stats snapshot (read by other threads without locking).

A runner exception is an engine-wide failure: every request in flight gets
Failed(EngineUnavailable), `healthy` turns false and later submissions are refused.
"""
from __future__ import annotations

import gc
import logging
import threading
import time

from ninfer_jax.engine import prompt_media
from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.host_pages import HostPagePool
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import GenerationRequest, RequestHandle
from ninfer_jax.engine.runner_api import StepRunner
from ninfer_jax.engine.scheduler import Scheduler
from ninfer_jax.engine.state_slots import StateSlotPool
from ninfer_jax.engine.step_loop import StepLoop
from ninfer_jax.engine.stats import EngineStats, build_stats
from ninfer_jax.errors import (
    ContextLengthExceeded, EngineUnavailable, InvalidRequest, MediaBudgetExceeded, Overloaded,
    Unsupported,
)

log = logging.getLogger("ninfer_jax.engine")

STATS_PERIOD_S = 0.01  # stats snapshots while the engine is busy: at most one per 10 ms


class Engine:
    def __init__(self, runner: StepRunner, config: EngineConfig, eos_ids=()):
        if config.max_concurrency > runner.max_batch:
            raise ValueError(f"max_concurrency {config.max_concurrency} exceeds the runner's "
                             f"largest decode batch {runner.max_batch}")
        if config.max_concurrency > runner.penalty_lanes:
            raise ValueError(f"max_concurrency {config.max_concurrency} exceeds the runner's "
                             f"{runner.penalty_lanes} penalty lanes")
        if (config.speculative is not None and getattr(runner, "state_slot_capacity", 0)
                and getattr(runner, "needs_chained_rows", True)
                and not getattr(runner, "chained_rows", False)):
            raise ValueError("speculative decoding on a hybrid model needs a runner whose "
                             "verify rows chain their state (JaxRunner(speculative=True))")
        self.runner = runner
        self.config = config
        self.pool = PagePool(runner.num_pages)
        # The runner sized the device state for its model (0 slots: dense, or no state).
        # (Dense under a DFlash drafter: slots of its draft store, no state.)
        self.slots = StateSlotPool(getattr(runner, "state_slot_capacity", 0),
                                   holds_state=getattr(runner, "slots_hold_state", True))
        page_bytes = getattr(runner, "page_bytes", 0)  # a runner without a host tier: 0
        state_bytes = getattr(runner, "state_bytes", 0)
        self.host = HostPagePool(config.host_pages(page_bytes, state_bytes), page_bytes,
                                 state_bytes)
        if page_bytes:
            runner.clear_host_pages()  # a runner that served an earlier engine
            if self.host.is_enabled and hasattr(runner, "use_host_tier"):
                runner.use_host_tier(self.host.capacity)
        self.scheduler = Scheduler(config, self.pool, page_size=runner.page_size,
                                   max_batch=runner.max_batch, eos_ids=eos_ids,
                                   slots=self.slots, host=self.host,
                                   max_chunk_rows=getattr(runner, "max_chunk_rows", None),
                                   chunk_segments=getattr(runner, "chunk_segments", 1),
                                   segment_tokens=getattr(runner, "segment_tokens", None),
                                   vocab_size=getattr(runner, "vocab_size", None))
        self.scheduler.life.on_terminal = self._on_terminal
        self.loop = StepLoop(self.scheduler, runner)
        # Called on the engine thread after every round (the engine-core process flushes
        # the round's events to the HTTP workers in one message); they must only enqueue.
        self.round_listeners: list = []
        if hasattr(runner, "on_compiled"):
            runner.on_compiled = self._on_compiled
        self.ready = threading.Event()  # set once warm-up finished
        self._cond = threading.Condition()
        self._inbox: list[RequestHandle] = []  # guarded by _cond
        self._outstanding = 0  # submitted, no terminal event yet; guarded by _cond
        self._woken = False  # a control arrived since the last round; guarded by _cond
        self._stopping = False
        self._healthy = True
        self._thread: threading.Thread | None = None
        self._freeze_heap = False
        self._compile_leftovers_frozen = False
        self._stats = EngineStats.empty(page_size=runner.page_size, capacity=self.pool.capacity,
                                        max_concurrency=config.max_concurrency,
                                        state_slots_capacity=self.slots.capacity)

    # ------------------------------------------------------------------ any thread

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def pool_tokens(self) -> int:
        return self.pool.capacity * self.runner.page_size

    def start(self, *, freeze_heap: bool = False) -> None:
        """`freeze_heap`: the engine owns its process (the engine core). Everything loaded by
        the end of warm-up then leaves the collector's generations (gc.freeze), so the
        collections the step loop's allocations trigger no longer walk it (1.5-2.5% of a CPU
        decode step's time). Off elsewhere: a frozen object is never collected, and a process
        that builds many engines (the test suite) kept every one, runner and compiled
        executables included, until it ran out of memory maps."""
        self._freeze_heap = freeze_heap
        self._thread = threading.Thread(target=self._run, name="ninfer-engine", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self.ready.wait(timeout)

    def stats(self) -> EngineStats:
        return self._stats  # an immutable snapshot, replaced whole by the engine thread

    def add_scheduling_listener(self, listener) -> None:
        """`listener(SchedulingEvent)` runs on the engine thread: it must only enqueue.
        Register before start()."""
        self.scheduler.life.listeners.append(listener)

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue a request. Raises InvalidRequest / ContextLengthExceeded for a request that
        can never run, Overloaded when max_concurrency + max_pending are outstanding, and
        EngineUnavailable after a failure or during shutdown."""
        self._validate(request)
        handle = RequestHandle(request, on_control=self._on_control)
        with self._cond:
            if not self._healthy or self._stopping:
                raise EngineUnavailable("the engine is not available")
            if self._outstanding >= self.config.max_outstanding:
                raise Overloaded(f"the server is at capacity ({self.config.max_outstanding} "
                                 f"requests running or waiting); retry later")
            self._outstanding += 1
            self._inbox.append(handle)
            self._cond.notify()
        return handle

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Stop the thread; requests still in flight get Failed(EngineUnavailable)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _validate(self, request: GenerationRequest) -> None:
        num_prompt = len(request.prompt_ids)
        if num_prompt == 0:
            raise InvalidRequest("the prompt must contain at least one token")
        if request.max_tokens < 0:
            raise InvalidRequest("max_tokens must be >= 0", param="max_tokens")
        if num_prompt + request.max_tokens > self.config.max_context:
            raise ContextLengthExceeded(num_prompt + request.max_tokens, self.config.max_context)
        if request.media and not getattr(self.runner, "accepts_media", False):
            # Media reached the engine prepared (serve/media), but this runner has no vision
            # tower to encode it: refused rather than generated from placeholder tokens.
            raise Unsupported("This engine has no vision encoder for the loaded model, so it "
                              "cannot generate from image or video input.",
                              param="messages", code="vision_disabled")
        if request.media:
            self._validate_media(request)
        # The prompt and its first sampled token must fit the KV pool on their own.
        needed = num_prompt + min(request.max_tokens, 1)
        if needed > self.pool_tokens:
            raise ContextLengthExceeded(needed, self.pool_tokens, message=(
                f"This request needs {needed} tokens of KV cache, but the server's KV pool "
                f"holds {self.pool_tokens} tokens."))

    def _validate_media(self, request: GenerationRequest) -> None:
        # The tower's attention is dense within a frame: a larger one would exhaust the
        # device and fail the engine for everyone.
        limit = getattr(self.runner, "max_frame_patches", None)
        largest = max(h * w for _, h, w in (item.grid_thw for item in request.media))
        if limit is not None and largest > limit:
            raise MediaBudgetExceeded(
                f"an image or video frame of {largest} patches exceeds the {limit} patches "
                "per frame this server's vision encoder takes", param="messages")
        try:
            prompt_media.build(request.media, len(request.prompt_ids))
        except ValueError as exc:  # serve/ built the spans; a mismatch is a caller's bug
            raise InvalidRequest(f"the prompt's media placeholders: {exc}") from None

    def _on_control(self, handle: RequestHandle) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify()

    def _on_compiled(self) -> None:
        """A step shape finished compiling (warm-up or background): show it in the stats.
        Before ready nothing else publishes; after, the engine thread does at its next round."""
        if not self.ready.is_set():
            self._publish_stats()
        else:
            self._on_control(None)

    def _on_terminal(self, seq) -> None:
        with self._cond:
            self._outstanding -= 1

    # ------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        try:
            self.runner.warmup()
            if self._freeze_heap:
                gc.freeze()
            self.ready.set()
            self._publish_stats()
            log.info("engine ready: %d KV pages of %d tokens, %d lanes", self.pool.capacity,
                     self.runner.page_size, self.config.max_concurrency)
            while self._round():
                pass
            self._fail_everything(EngineUnavailable("the server is shutting down"))
        except Exception:
            log.exception("engine failure: every request in flight fails")
            self._healthy = False
            self._fail_everything(EngineUnavailable("the engine failed; the server must restart"))
        self._publish_stats()

    def _freeze_compile_leftovers(self) -> None:
        """Once every background compile has run (engine core only): freeze what they left
        on the heap too. Traced jaxprs and the like (about a million containers for the 8B
        server's 28 shapes) would otherwise be walked by every full collection, with the GIL
        held: run 45's 256-stream level had a 212 ms collection inside one launch."""
        if not self._freeze_heap or self._compile_leftovers_frozen:
            return
        ready, planned = self.runner.compile_progress()
        if ready < planned:
            return
        self._compile_leftovers_frozen = True
        before = gc.get_freeze_count()
        gc.freeze()
        log.info("froze %d more objects left by the background compiles (full collections "
                 "skip them)", gc.get_freeze_count() - before)

    def _round(self) -> bool:
        """One scheduling round; False once the engine is stopping."""
        scheduler, loop = self.scheduler, self.loop
        # Idle: executables compiled in the background take their first run now, one at a
        # time, rather than in front of a request (runner.prime_one).
        primed = False
        while not self._has_round_work() and self.runner.prime_one():
            primed = True
        if primed:  # /health counts primed executables as ready: tell the workers now, not
            self._publish_stats()  # at the next round's end (a request's, maybe minutes away)
            for listener in self.round_listeners:
                listener()
            self._freeze_compile_leftovers()
        with self._cond:
            while not self._has_round_work():
                self._cond.wait()
            if self._stopping:
                return False
            inbox, self._inbox, self._woken = self._inbox, [], False
        host_work = scheduler.counters.host_work
        started = time.perf_counter()
        for handle in inbox:
            scheduler.add(handle)
        scheduler.apply_controls()
        host_work["engine_boundary"] += time.perf_counter() - started
        if not loop.advance() and scheduler.has_work():
            # Not expected (an idle scheduler with work always admits some); never spin.
            with self._cond:
                self._cond.wait(0.01)
        started = time.perf_counter()
        # A snapshot costs about a microsecond per resident: at most one per STATS_PERIOD_S
        # while busy, and always one when the engine goes idle (nothing else would follow).
        idle = not (scheduler.has_work() or loop.in_flight)
        if idle or time.monotonic() - self._stats.time >= STATS_PERIOD_S:
            self._publish_stats()
        for listener in self.round_listeners:
            listener()
        host_work["engine_maintenance"] += time.perf_counter() - started
        return True

    def _has_round_work(self) -> bool:
        return bool(self._inbox or self._woken or self._stopping or self.scheduler.has_work()
                    or self.loop.in_flight)

    def _fail_everything(self, error: EngineUnavailable) -> None:
        with self._cond:
            inbox, self._inbox = self._inbox, []
            self._stopping = True
        for handle in inbox:
            self.scheduler.add(handle)
        self.scheduler.fail_all(error)

    def _publish_stats(self) -> None:
        compiled, total = self.runner.compile_progress()
        gauges = self.scheduler.gauges()
        gauges.update(compiled_shapes=compiled, total_shapes=total)
        self._stats = build_stats(self.scheduler.counters, gauges=gauges,
                                  ready=self.ready.is_set(), healthy=self._healthy)

