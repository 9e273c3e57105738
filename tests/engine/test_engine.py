"""The Engine thread with the fake runner: submit/admission errors, wake-ups, failure, stats."""
import threading
import time

import pytest

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.engine import Engine
from ninfer_jax.engine.fake import FakeRunner
from ninfer_jax.engine.request import Failed, Finished, Tokens
from ninfer_jax.errors import (
    ContextLengthExceeded, EngineUnavailable, InvalidRequest, Overloaded, QueueTimeout,
)

from engine_testkit import VOCAB, expected_output, make_request, prompt_of, terminal

TIMEOUT = 10.0


def collect(handle, timeout=TIMEOUT):
    events = []
    deadline = time.monotonic() + timeout
    while not events or not isinstance(events[-1], (Finished, Failed)):
        event = handle.next_event(timeout=max(0.0, deadline - time.monotonic()))
        assert event is not None, f"no terminal event within {timeout}s: {events}"
        events.append(event)
    return events


def wait_for(predicate, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


@pytest.fixture
def make_engine():
    engines = []

    def build(runner=None, eos_ids=(), **config):
        runner = runner or FakeRunner(num_pages=33, page_size=4, vocab_size=VOCAB)
        engine = Engine(runner, EngineConfig(**config), eos_ids=eos_ids)
        engine.start()
        assert engine.wait_ready(TIMEOUT)
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.shutdown()


def test_concurrent_requests_complete_with_exact_outputs(make_engine):
    engine = make_engine(max_concurrency=4)
    prompts = [prompt_of(3 + i, salt=i) for i in range(6)]
    handles = [engine.submit(make_request(p, max_tokens=10)) for p in prompts]
    for prompt, handle in zip(prompts, handles):
        end = terminal(collect(handle))
        assert list(end.output_ids) == expected_output(prompt, 10)
    wait_for(lambda: engine.stats().running == 0)
    stats = engine.stats()
    assert stats.kv_pages_used == stats.kv_pages_cached and stats.requests["length"] == 6
    assert stats.generation_tokens == 60 and stats.prompt_tokens == sum(map(len, prompts))
    assert stats.decode_tokens == 60 - 6  # each first token came from a prefill
    assert max(stats.decode_batch_sizes) <= 4 and stats.ready and stats.healthy


def test_submit_rejects_what_can_never_run(make_engine):
    engine = make_engine(max_context=32)
    with pytest.raises(ContextLengthExceeded) as info:
        engine.submit(make_request(prompt_of(20), max_tokens=13))
    assert (info.value.num_tokens, info.value.max_context) == (33, 32)
    with pytest.raises(InvalidRequest):
        engine.submit(make_request([], max_tokens=1))
    small_pool = make_engine(runner=FakeRunner(num_pages=3, page_size=4), max_context=64)
    with pytest.raises(ContextLengthExceeded):
        small_pool.submit(make_request(prompt_of(8), max_tokens=1))  # 9 > 8 pool tokens


def test_overloaded_when_lanes_and_queue_are_full(make_engine):
    engine = make_engine(runner=FakeRunner(decode_sleep=0.02), max_concurrency=1,
                         max_pending=1)
    first = engine.submit(make_request(prompt_of(3), max_tokens=20))
    second = engine.submit(make_request(prompt_of(3, salt=1), max_tokens=2))
    with pytest.raises(Overloaded) as info:
        engine.submit(make_request(prompt_of(3, salt=2), max_tokens=2))
    assert info.value.status == 429 and info.value.code == "server_overloaded"
    first.cancel()
    assert terminal(collect(first)).reason == "cancelled"
    assert terminal(collect(second)).reason == "length"
    third = engine.submit(make_request(prompt_of(3, salt=2), max_tokens=2))  # room again
    assert terminal(collect(third)).reason == "length"


def test_pending_timeout_fails_a_request_that_waits_too_long(make_engine):
    engine = make_engine(runner=FakeRunner(decode_sleep=0.02), max_concurrency=1,
                         pending_timeout=0.1)
    busy = engine.submit(make_request(prompt_of(3), max_tokens=30))
    late = engine.submit(make_request(prompt_of(3, salt=1), max_tokens=2))
    events = collect(late)
    assert len(events) == 1 and isinstance(events[0].error, QueueTimeout)
    assert terminal(collect(busy)).reason == "length"


def test_cancel_from_another_thread_frees_pages(make_engine):
    engine = make_engine(runner=FakeRunner(num_pages=33, decode_sleep=0.01), max_context=128)
    handle = engine.submit(make_request(prompt_of(5), max_tokens=100))
    assert handle.next_event(TIMEOUT) is not None  # Admitted: it is running
    wait_for(lambda: engine.stats().kv_pages_used > engine.stats().kv_pages_cached)
    threading.Thread(target=handle.cancel).start()
    end = terminal(collect(handle))
    assert end.reason == "cancelled" and len(end.output_ids) < 100
    wait_for(lambda: engine.stats().kv_pages_used == engine.stats().kv_pages_cached)


def test_stop_at_from_the_http_side(make_engine):
    engine = make_engine(runner=FakeRunner(decode_sleep=0.005), max_context=128)
    prompt = prompt_of(4)
    handle = engine.submit(make_request(prompt, max_tokens=100))
    seen = 0
    while seen < 3:
        event = handle.next_event(TIMEOUT)
        if isinstance(event, Tokens):
            seen = event.num_committed
    handle.stop_at(2)  # the stop string ended inside the second token
    end = terminal(collect(handle))
    assert end.reason == "stop" and list(end.output_ids) == expected_output(prompt, 2)


def test_idle_engine_sleeps_until_woken(make_engine):
    runner = FakeRunner()
    engine = make_engine(runner=runner)
    terminal(collect(engine.submit(make_request(prompt_of(3), max_tokens=2))))
    wait_for(lambda: engine.stats().requests["length"] == 1)  # the round's last snapshot
    stats_before = engine.stats()
    time.sleep(0.2)
    assert engine.stats() is stats_before  # no rounds ran while idle: nothing was republished
    terminal(collect(engine.submit(make_request(prompt_of(3), max_tokens=2))))
    assert engine.stats() is not stats_before


def test_runner_failure_fails_everything_and_marks_unhealthy(make_engine):
    runner = FakeRunner(fail_at_step=3, decode_sleep=0.01)
    engine = make_engine(runner=runner, max_concurrency=2)
    handles = [engine.submit(make_request(prompt_of(3, salt=i), max_tokens=10))
               for i in range(3)]
    for handle in handles:
        end = terminal(collect(handle))
        assert isinstance(end, Failed) and isinstance(end.error, EngineUnavailable)
    assert not engine.healthy and not engine.stats().healthy
    with pytest.raises(EngineUnavailable):
        engine.submit(make_request(prompt_of(3), max_tokens=1))


def test_shutdown_fails_requests_in_flight(make_engine):
    engine = make_engine(runner=FakeRunner(decode_sleep=0.01), max_context=256)
    handle = engine.submit(make_request(prompt_of(3), max_tokens=200))
    assert handle.next_event(TIMEOUT) is not None
    engine.shutdown()
    end = terminal(collect(handle))
    assert isinstance(end, Failed) and isinstance(end.error, EngineUnavailable)
    with pytest.raises(EngineUnavailable):
        engine.submit(make_request(prompt_of(3), max_tokens=1))


def test_ready_only_after_warmup():
    gate = threading.Event()
    runner = FakeRunner(warmup_gate=gate)
    engine = Engine(runner, EngineConfig())
    engine.start()
    try:
        handle = engine.submit(make_request(prompt_of(3), max_tokens=2))  # queued meanwhile
        assert not engine.wait_ready(0.1) and not engine.stats().ready
        gate.set()
        assert engine.wait_ready(TIMEOUT) and runner.is_warm
        assert terminal(collect(handle)).reason == "length"
        wait_for(lambda: engine.stats().ready)
    finally:
        engine.shutdown()


def test_streams_keep_decoding_during_a_long_prefill_with_async_dispatch(make_engine):
    """The fake device runs steps after `launch` returns, as JAX does: a stream that is
    decoding when a 16-chunk prompt arrives gets a token in every step that carries one of
    those chunks (the old decode-share timer measured dispatch time and starved it)."""
    runner = FakeRunner(num_pages=200, page_size=4, vocab_size=VOCAB, prefill_sleep=0.01,
                        decode_sleep=0.002)
    engine = make_engine(runner, max_concurrency=2, prefill_chunk=8)
    stream = engine.submit(make_request(prompt_of(3), max_tokens=200))
    wait_for(lambda: any(s[0] == "decode" for s in list(runner.steps)))
    long_prompt = prompt_of(128, salt=1)  # 16 chunks of 8
    prompt_handle = engine.submit(make_request(long_prompt, max_tokens=1))
    end = terminal(collect(prompt_handle))
    assert list(end.output_ids) == expected_output(long_prompt, 1)
    chunk_steps = [plan for plan in list(runner.plans)
                   if plan.chunk is not None and plan.chunk.seq_id == 1]
    assert len(chunk_steps) == 16
    # Every chunk step also decoded the stream (the stream had 200 tokens to go).
    assert all([row.seq_id for row in plan.rows] == [0] for plan in chunk_steps)
    stream.cancel()
    assert terminal(collect(stream)).reason == "cancelled"


def test_host_work_and_device_wait_are_measured_by_phase(make_engine):
    runner = FakeRunner(num_pages=33, page_size=4, vocab_size=VOCAB, decode_sleep=0.002)
    engine = make_engine(runner, max_concurrency=2)
    handle = engine.submit(make_request(prompt_of(5), max_tokens=6))
    terminal(collect(handle))
    wait_for(lambda: engine.stats().requests["length"] == 1)
    stats = engine.stats()
    # Six decode-bearing steps of 2 ms each are waited for, not counted as host work.
    assert stats.device_wait_seconds >= 0.008
    assert set(stats.host_work) == {"engine_boundary", "program_submit", "program_post",
                                    "engine_commit_output", "engine_maintenance"}
    assert stats.host_work["program_submit"] > 0 and stats.host_work["engine_commit_output"] > 0
    # The launches, by kind: the 5-token prompt's one chunk alone, then decode rows only.
    assert stats.launches == {"decode": 5, "prefill": 1, "mixed": 0}
    assert all(stats.launch_seconds[kind] > 0 for kind in ("decode", "prefill"))
    assert stats.launch_seconds["mixed"] == 0.0
    assert sum(stats.launch_seconds.values()) <= stats.host_work["program_submit"]


def test_a_step_with_a_chunk_and_rows_is_launched_as_mixed(make_engine):
    runner = FakeRunner(num_pages=65, page_size=4, vocab_size=VOCAB, decode_sleep=0.002)
    engine = make_engine(runner, max_concurrency=2, prefill_chunk=4)
    first = engine.submit(make_request(prompt_of(5), max_tokens=40))
    wait_for(lambda: engine.stats().decode_rounds >= 1)
    second = engine.submit(make_request(prompt_of(30, salt=3), max_tokens=2))
    terminal(collect(first)), terminal(collect(second))
    wait_for(lambda: engine.stats().requests["length"] == 2)
    stats = engine.stats()
    assert stats.launches["mixed"] >= 1  # the second prompt's chunks ride with the first's rows
    assert stats.launch_seconds["mixed"] > 0


def test_compiles_inside_launches_are_counted_and_named(caplog, monkeypatch):
    """A launch that makes XLA compile (a jitted helper meeting a shape warm-up did not
    compile: run 41's host-tier save of a new run length) is counted, in compiles and seconds,
    and a slow submit's line says how much of it was compiling; a compile on another thread
    (the background compiles) is not the launch's."""
    import logging
    import threading

    import jax
    import numpy as np

    from ninfer_jax.engine import step_loop
    from ninfer_jax.engine.compile_clock import COMPILE_CLOCK
    from ninfer_jax.engine.step_loop import StepLoop

    from engine_testkit import Driver

    monkeypatch.setattr(step_loop, "SLOW_SUBMIT_S", 0.0)  # every submit is "slow": logged
    COMPILE_CLOCK.install()
    driver = Driver(max_concurrency=2, prefill_chunk=64)
    launch = driver.runner.launch
    sizes = iter(range(3, 1000))

    def compiling_launch(plan):
        if plan.chunk is not None:  # a fresh shape each time: a real compile
            jax.jit(lambda x: x * 2 + 1)(np.zeros(next(sizes), np.float32)).block_until_ready()
        return launch(plan)

    elsewhere = threading.Thread(target=lambda: jax.jit(lambda x: x - 5)(np.zeros(2)))
    driver.runner.launch = compiling_launch
    driver.loop = StepLoop(driver.scheduler, driver.runner)
    with caplog.at_level(logging.INFO, logger="ninfer_jax.engine"):
        elsewhere.start(), elsewhere.join()
        driver.run_all([make_request(prompt_of(5), max_tokens=3),
                        make_request(prompt_of(7, salt=2), max_tokens=3)])
    counters = driver.scheduler.counters
    assert counters.launch_compiles == 2  # the two chunks' launches, not the thread's compile
    assert counters.launch_compile_seconds > 0
    assert counters.launch_compile_seconds <= sum(counters.launch_seconds.values())
    lines = [r.getMessage() for r in caplog.records if "slow step submit" in r.getMessage()]
    # the first launch (a chunk's, then once per SLOW_LOG_PERIOD_S): its compile is named
    assert "a 5-token chunk" in lines[0] and "compiling 0.0 ms" not in lines[0], lines[0]


def test_a_stopped_engine_and_its_runner_are_collected():
    """An engine started in a process that builds many (tests, benchmarks) leaves nothing
    behind once stopped: with gc.freeze() after every warm-up the suite kept every runner and
    its compiled executables until XLA ran out of memory maps (start(freeze_heap=True) is for
    the engine core, which owns its process)."""
    import gc
    import weakref

    runner = FakeRunner(num_pages=33, page_size=4, vocab_size=VOCAB)
    engine = Engine(runner, EngineConfig(max_concurrency=2), eos_ids=())
    engine.start()
    assert engine.wait_ready(TIMEOUT)
    terminal(collect(engine.submit(make_request(prompt_of(5), max_tokens=3))))
    engine.shutdown()
    gone = weakref.ref(engine), weakref.ref(runner)
    del engine, runner
    deadline = time.monotonic() + TIMEOUT  # the fake device thread lets go within 0.5 s
    while any(ref() is not None for ref in gone):
        assert time.monotonic() < deadline, "a stopped engine or its runner is still alive"
        gc.collect()
        time.sleep(0.05)


def test_the_engine_core_freezes_what_background_compiles_leave():
    """With freeze_heap (the engine core), the objects background compiles leave after
    warm-up's gc.freeze are frozen too once every shape has compiled and run, so full
    collections do not walk them with the GIL held (run 45: 212 ms inside one launch)."""
    import gc

    class CompilingRunner(FakeRunner):
        """Two shapes "compile in the background": each first run leaves 20k containers."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.pending, self.leftovers = 2, []

        def compile_progress(self):
            return (2 - self.pending if self.is_warm else 0), 2

        def prime_one(self):
            if not self.pending:
                return False
            self.pending -= 1
            self.leftovers.append([[i] for i in range(20_000)])
            return True

    def leftovers_frozen():
        # A frozen object sits in the permanent generation, which gc.get_objects() leaves
        # out. (Counting gc.get_freeze_count() instead was flaky in a long pytest process:
        # frozen objects that die by refcount leave the count.)
        if len(runner.leftovers) < 2:
            return False
        ids = {id(lst) for lst in runner.leftovers}
        return not any(id(obj) in ids for obj in gc.get_objects())

    runner = CompilingRunner(num_pages=33, page_size=4, vocab_size=VOCAB)
    engine = Engine(runner, EngineConfig(max_concurrency=2), eos_ids=())
    try:
        engine.start(freeze_heap=True)
        assert engine.wait_ready(TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        while not leftovers_frozen():
            assert time.monotonic() < deadline, "the compiles' leftovers were not frozen"
            time.sleep(0.02)
        terminal(collect(engine.submit(make_request(prompt_of(5), max_tokens=3))))
    finally:
        engine.shutdown()
        gc.unfreeze()  # this process builds many engines (see the test above)


def test_a_slow_step_submit_is_logged_with_where_it_went(caplog):
    """A plan plus launch of SLOW_SUBMIT_S or more is logged (live runs name the steps behind
    a large program_submit), at most once per SLOW_LOG_PERIOD_S of the loop's clock, the
    next line counting the ones in between."""
    import logging

    from ninfer_jax.engine.step_loop import StepLoop

    from engine_testkit import Driver

    driver = Driver(max_concurrency=2, prefill_chunk=64)
    now = [0.0]
    launch = driver.runner.launch

    def slow_launch(plan):
        now[0] += 0.25  # by the loop's clock, every launch takes 250 ms
        return launch(plan)

    driver.runner.launch = slow_launch
    driver.loop = StepLoop(driver.scheduler, driver.runner, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="ninfer_jax.engine"):
        driver.run_all([make_request(prompt_of(5), max_tokens=30)])
    lines = [r.getMessage() for r in caplog.records if "slow step submit" in r.getMessage()]
    assert lines[0] == ("slow step submit: 250 ms (planning 0.0 ms, launching 250.0 ms; "
                        "garbage collection 0.0 ms, compiling 0.0 ms of it) for 0 rows and a "
                        "5-token chunk")
    assert len(lines) == 2  # about 30 launches: 7.5 s of the loop's clock
    assert lines[1].startswith("slow step submit: 250 ms") and lines[1].endswith(
        "; 19 more since the last such line")
