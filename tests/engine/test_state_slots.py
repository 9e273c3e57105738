"""State slots: the pool itself, the fake device state that makes slot bugs visible, and the
scheduler's slot rules with a hybrid-like fake model (concurrency, pressure, fewer slots than
lanes, every ending giving its slot back). Prefix reuse through state checkpoints:
test_state_checkpoints.py."""
import numpy as np
import pytest

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.fake import FakeRunner, state_of
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner_api import PrefillUnit, SampleSpec, StepPlan
from ninfer_jax.engine.state_slots import (
    DUMMY_STATE_SLOT, SlotsExhausted, StateSlotPool, state_slot_capacity,
)

from engine_testkit import (
    GREEDY, VOCAB, Driver, drain, expected_output, finished, make_request, prompt_of,
)


# ---------------------------------------------------------------------- the pool


def test_dummy_slot_matches_the_model_constant():
    ragged_batch = pytest.importorskip("ninfer_jax.model.ragged_batch")
    assert DUMMY_STATE_SLOT == ragged_batch.DUMMY_STATE_SLOT


def test_pool_hands_out_slots_1_to_n_and_reuses_freed_ones_last():
    pool = StateSlotPool(3)
    assert pool.is_enabled and pool.num_slots == 4
    slots = [pool.alloc() for _ in range(3)]
    assert slots == [1, 2, 3] and pool.num_used == 3 and pool.num_free == 0
    with pytest.raises(SlotsExhausted):
        pool.alloc()
    pool.release(2)
    pool.check([1, 3])
    assert pool.alloc() == 2
    pool.release(1)
    pool.release(3)
    assert pool.alloc() == 1  # FIFO: the slot freed first comes back first
    pool.check([1, 2, DUMMY_STATE_SLOT])


def test_pool_refuses_bad_releases_and_its_checker_sees_leaks():
    pool = StateSlotPool(2)
    with pytest.raises(ValueError):
        pool.release(DUMMY_STATE_SLOT)
    slot = pool.alloc()
    pool.release(slot)
    with pytest.raises(ValueError):
        pool.release(slot)  # twice
    held = pool.alloc()
    with pytest.raises(AssertionError):
        pool.check([])  # leaked
    with pytest.raises(AssertionError):
        pool.check([held, held])  # two holders


def test_dense_models_have_no_slots():
    pool = StateSlotPool(0)
    assert not pool.is_enabled and pool.num_slots == 0 and pool.capacity == 0
    assert state_slot_capacity(has_state=False, max_concurrency=4, extra_slots=3) == 0
    assert state_slot_capacity(has_state=True, max_concurrency=4, extra_slots=3) == 7
    config = EngineConfig(max_concurrency=2, device_state_slots=2)
    assert config.state_slot_capacity(True) == 4 and config.state_slot_capacity(False) == 0
    with pytest.raises(ValueError):
        EngineConfig(device_state_slots=-1)


# ---------------------------------------------------------------------- the fake device


def _chunk(tokens, start, slot, pages=(1, 2)):
    sample = SampleSpec(params=GREEDY, sample_index=0)
    return StepPlan(chunk=PrefillUnit(seq_id=0, tokens=np.asarray(tokens, np.int32),
                                      start=start, page_table=np.asarray(pages, np.int32),
                                      sample=sample, state_slot=slot))


def _run(runner, plan):
    return runner.collect(runner.launch(plan)).chunk_token


def test_fake_state_makes_a_continuation_on_another_slot_differ():
    """The fake is only useful if slot mistakes change tokens: a prompt continued on its own
    slot matches the formula, the same chunk continued on a fresh or stale slot does not."""
    prompt = prompt_of(8)
    expected = expected_output(prompt, 1, hybrid=True)[0]
    runner = FakeRunner(num_pages=8, page_size=4, vocab_size=VOCAB, state_slot_capacity=2,
                        async_dispatch=False)
    _run(runner, _chunk(prompt[:4], 0, slot=1))
    assert _run(runner, _chunk(prompt[4:], 4, slot=1)) == expected
    _run(runner, _chunk(prompt[:4], 0, slot=1))
    assert _run(runner, _chunk(prompt[4:], 4, slot=2)) != expected  # fresh slot, mid-prompt
    _run(runner, _chunk(prompt_of(4, salt=5), 0, slot=2))
    _run(runner, _chunk(prompt[:4], 0, slot=1))
    assert _run(runner, _chunk(prompt[4:], 4, slot=2)) != expected  # another sequence's slot
    with pytest.raises(AssertionError, match="state slot 0"):
        _run(runner, _chunk(prompt, 0, slot=DUMMY_STATE_SLOT))
    assert state_of([]) == 0 and state_of([1]) != state_of([2])


# ---------------------------------------------------------------------- scheduling


def _hybrid_outputs(driver, requests):
    handles = [driver.submit(request) for request in requests]
    driver.run()
    return [finished(handle) for handle in handles]


def test_eight_concurrent_streams_equal_each_request_alone():
    requests = [make_request(prompt_of(5 + 3 * i, salt=i), max_tokens=40) for i in range(8)]
    seeded = SamplingParams(temperature=0.8, seed=11)
    requests.append(make_request(prompt_of(9, salt=9), max_tokens=40, sampling=seeded))
    together = Driver(state_slots=9, max_concurrency=8, num_pages=256, prefill_chunk=8)
    ends = _hybrid_outputs(together, requests)
    assert max(len(p.rows) for p in together.schedules) == 8  # really batched
    for request, end in zip(requests, ends):
        alone = Driver(state_slots=1, max_concurrency=1, num_pages=64, prefill_chunk=8)
        [solo] = _hybrid_outputs(alone, [make_request(request.prompt_ids, max_tokens=40,
                                                      sampling=request.sampling)])
        assert list(end.output_ids) == list(solo.output_ids) == expected_output(
            request.prompt_ids, 40, sampling=request.sampling, hybrid=True)
    assert together.slots.num_used == together.scheduler.checkpoints.num_checkpoints


def test_pressure_pauses_free_the_slot_and_replay_restarts_at_zero():
    """Without a checkpoint to start from (no prefix reuse here) a restore replays from 0."""
    driver = Driver(state_slots=4, num_pages=11, page_size=4, max_concurrency=4,
                    prefill_chunk=4, prefix_reuse=False)
    scheduler = driver.scheduler
    seen_pause = []

    def on_event(event):
        if event.kind == "paused":
            assert sequences[event.seq_id].state_slot == DUMMY_STATE_SLOT
            assert driver.slots.num_used == len(scheduler.resident)
            seen_pause.append(event.seq_id)

    scheduler.life.listeners.append(on_event)
    prompts = [prompt_of(6, salt=i) for i in range(4)]
    handles = [driver.submit(make_request(p, max_tokens=20)) for p in prompts]
    sequences = {s.seq_id: s for s in scheduler.waiting}
    driver.run()
    ends = [finished(h) for h in handles]
    assert seen_pause and scheduler.counters.replay_restores > 0
    for prompt, end in zip(prompts, ends):
        assert list(end.output_ids) == expected_output(prompt, 20, hybrid=True)
        assert end.counters["restored_cached_tokens"] == 0
    # Every paused sequence's next chunk after its pause started at position 0.
    first_chunk_after = {}
    for plan in driver.schedules:
        unit = plan.chunk
        if unit is not None and unit.seq_id in seen_pause and unit.seq_id not in first_chunk_after:
            first_chunk_after[unit.seq_id] = unit.start
    assert all(start == 0 for start in first_chunk_after.values())
    assert driver.slots.num_used == 0 and driver.request_pages() == 0


def test_requests_wait_for_a_free_slot_when_slots_are_fewer_than_lanes():
    driver = Driver(state_slots=2, max_concurrency=4, num_pages=128, prefill_chunk=4,
                    prefix_reuse=False)
    most = []
    driver.loop.on_step = lambda plan: (driver.schedules.append(plan),
                                        most.append(len(driver.scheduler.resident)))
    prompts = [prompt_of(7, salt=i) for i in range(6)]
    ends = _hybrid_outputs(driver, [make_request(p, max_tokens=9) for p in prompts])
    assert max(most) == 2
    for prompt, end in zip(prompts, ends):
        assert list(end.output_ids) == expected_output(prompt, 9, hybrid=True)
    assert driver.slots.num_used == 0


def test_cancel_and_finish_give_slots_back():
    driver = Driver(state_slots=3, max_concurrency=3, num_pages=64, prefill_chunk=4)
    handles = [driver.submit(make_request(prompt_of(6, salt=i), max_tokens=40))
               for i in range(3)]
    for _ in range(6):
        driver.step()
    assert driver.slots.num_used == 3
    handles[1].cancel()
    driver.step()
    assert driver.slots.num_used == 2
    driver.run()
    assert [finished(h).reason for h in handles] == ["length", "cancelled", "length"]
    assert driver.slots.num_used == 0


def test_dense_plans_name_the_dummy_slot_and_gauges_stay_zero():
    driver = Driver(max_concurrency=2)
    _hybrid_outputs(driver, [make_request(prompt_of(5, salt=i), max_tokens=4)
                             for i in range(2)])
    units = [p.chunk for p in driver.schedules if p.chunk] + [
        r for p in driver.schedules for r in p.rows]
    assert {u.state_slot for u in units} == {DUMMY_STATE_SLOT}
    gauges = driver.scheduler.gauges()
    assert gauges["state_slots_used"] == gauges["state_slots_capacity"] == 0
    assert driver.scheduler.cache is not None


def test_engine_stats_and_metrics_report_slots():
    from ninfer_jax.engine.engine import Engine
    from ninfer_jax.serve.observability.metrics import ENGINE_GAUGES, _value

    config = EngineConfig(max_concurrency=2, device_state_slots=1, prefill_chunk=4)
    runner = FakeRunner(num_pages=64, page_size=4, vocab_size=VOCAB, decode_sleep=0.002,
                        state_slot_capacity=config.state_slot_capacity(True))
    engine = Engine(runner, config)
    fields = {name: field for name, _, field in ENGINE_GAUGES}
    used_field = fields["ninfer_device_state_used_slots"]
    assert _value(engine.stats(), fields["ninfer_device_state_capacity_slots"]) == 3
    engine.start()
    try:
        assert engine.wait_ready(10)
        prompts = [prompt_of(6, salt=i) for i in range(5)]
        handles = [engine.submit(make_request(p, max_tokens=30)) for p in prompts]
        seen = set()
        for prompt, handle in zip(prompts, handles):
            while (event := handle.next_event(timeout=10)) is not None:
                seen.add(_value(engine.stats(), used_field))
                if hasattr(event, "reason"):
                    break
            assert list(event.output_ids) == expected_output(prompt, 30, hybrid=True)
        assert 2.0 in seen and max(seen) <= 3.0  # lanes, and the spare slot's checkpoint
    finally:
        engine.shutdown()
    stats = engine.stats()
    checkpoints = engine.scheduler.checkpoints.num_checkpoints
    assert stats.state_slots_used == checkpoints <= 1 and stats.state_slots_capacity == 3


def test_a_slot_is_only_ever_taken_at_position_zero():
    """The guard behind "replay from 0": a sequence with KV already (a prefix hit, a restore
    that kept pages) cannot take a fresh slot, whose state would be zero mid-sequence."""
    driver = Driver(state_slots=1, max_concurrency=1)
    handle = driver.submit(make_request(prompt_of(9), max_tokens=2))
    seq = driver.scheduler.waiting[0]
    with pytest.raises(RuntimeError, match="fresh state slot at position 8"):
        driver.scheduler.life.admit(seq, cache_n=8)
    assert handle.next_event(timeout=0) is None and driver.slots.num_used == 0
