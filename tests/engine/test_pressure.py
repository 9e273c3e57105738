"""KV pressure: pausing the youngest, restoring by replay in order, identical outputs."""
import logging

from ninfer_jax.engine.request import Finished
from ninfer_jax.engine.sequence import Status

from engine_testkit import Driver, drain, expected_output, finished, make_request, prompt_of


def watch_pressure(driver):
    """Record pause/restore transitions and check the ordering rules as they happen."""
    paused: set[int] = set()
    log = []

    def listener(event):
        scheduler = driver.scheduler
        if event.kind == "paused":
            # The oldest resident keeps running: a pause never takes it.
            assert scheduler.resident and scheduler.resident[0].seq_id < event.seq_id
            paused.add(event.seq_id)
        elif event.kind == "restored":
            assert event.seq_id == min(paused), "restores follow original request order"
            paused.remove(event.seq_id)
        log.append((event.kind, event.seq_id))

    driver.scheduler.life.listeners.append(listener)
    return log


def test_tiny_pool_pauses_and_replays_with_unchanged_outputs():
    driver = Driver(num_pages=11, page_size=4, max_concurrency=4, prefill_chunk=4)
    log = watch_pressure(driver)
    prompts = [prompt_of(6, salt=i) for i in range(4)]
    handles = [driver.submit(make_request(p, max_tokens=20)) for p in prompts]
    driver.run()
    ends = [finished(h) for h in handles]
    for prompt, end in zip(prompts, ends):
        assert end.reason == "length"
        assert list(end.output_ids) == expected_output(prompt, 20)
    counters = driver.scheduler.counters
    assert counters.preemptions > 0 and counters.replay_restores > 0
    assert counters.replayed_tokens == sum(e.counters["replayed_tokens"] for e in ends) > 0
    assert sum(e.counters["preemptions"] for e in ends) == counters.preemptions
    assert ends[0].counters["preemptions"] == 0  # the oldest always progressed
    restored = [seq for kind, seq in log if kind == "restored"]
    completed = [seq for kind, seq in log if kind == "replay_complete"]
    assert restored and sorted(completed) == sorted(restored)
    assert driver.request_pages() == 0


def test_replay_never_resends_tokens():
    driver = Driver(num_pages=9, page_size=2, max_concurrency=3)
    handles = [driver.submit(make_request(prompt_of(4, salt=i), max_tokens=12))
               for i in range(3)]
    driver.run()
    assert driver.scheduler.counters.preemptions > 0
    for i, handle in enumerate(handles):
        streamed = [t for e in drain(handle) if hasattr(e, "ids") for t in e.ids]
        assert streamed == expected_output(prompt_of(4, salt=i), 12)


def test_paused_request_does_not_block_a_fresh_one_that_fits():
    driver = Driver(num_pages=11, page_size=4, max_concurrency=2)
    old = driver.submit(make_request(prompt_of(4), max_tokens=30))
    young = driver.submit(make_request(prompt_of(4, salt=1), max_tokens=30))
    while not driver.scheduler.paused:
        assert driver.step()
    [paused] = driver.scheduler.paused
    assert paused.handle is young
    small = driver.submit(make_request(prompt_of(2, salt=2), max_tokens=2))
    small_events = []
    while not any(isinstance(e, Finished) for e in small_events):
        assert driver.step()
        small_events += drain(small)
        assert paused.status is Status.PAUSED  # still waiting for room to replay
    driver.run()
    assert small_events[-1].reason == "length"
    young_end, old_end = finished(young), finished(old)
    assert young_end.counters["preemptions"] >= 1
    assert list(young_end.output_ids) == expected_output(prompt_of(4, salt=1), 30)
    assert list(old_end.output_ids) == expected_output(prompt_of(4), 30)


def test_request_that_outgrows_the_whole_pool_ends_with_length():
    driver = Driver(num_pages=4, page_size=4, max_context=1000)  # 12 tokens of KV
    handle = driver.submit(make_request(prompt_of(6), max_tokens=50))
    driver.run()
    end = finished(handle)
    # Positions 0..11 have KV; the token at position 12 was sampled but could not be decoded.
    assert end.reason == "length" and len(end.output_ids) == 12 - 6 + 1
    assert list(end.output_ids) == expected_output(prompt_of(6), 7)


def test_pause_while_prefilling_replays_the_prompt_part_already_computed():
    driver = Driver(num_pages=13, page_size=4, max_concurrency=2, prefill_chunk=1,
                    decode_share=1.0)
    pauses = []
    driver.scheduler.life.listeners.append(
        lambda e: pauses.append(e.num_tokens) if e.kind == "paused" else None)
    old = driver.submit(make_request(prompt_of(4), max_tokens=40))
    driver.step()
    while len(driver.scheduler.resident[0].pages) < 7:
        driver.step()
    # The young prompt fits now, but the old request's growth takes pages mid-prompt.
    young = driver.submit(make_request(prompt_of(16, salt=3), max_tokens=3))
    driver.run()
    assert pauses == [16]  # paused with its prompt only partly computed, no output yet
    young_end = finished(young)
    assert list(young_end.output_ids) == expected_output(prompt_of(16, salt=3), 3)
    assert list(finished(old).output_ids) == expected_output(prompt_of(4), 40)
    counters = young_end.counters
    assert counters["prefill_tokens"] == 16  # each prompt token counted once as prefill
    assert 0 < counters["replayed_tokens"] < 16


def test_pressure_log_names_requests_and_counts(caplog):
    caplog.set_level(logging.INFO, logger="ninfer_jax.engine.pressure")
    driver = Driver(num_pages=11, page_size=4, max_concurrency=2, prefix_reuse=False)
    driver.submit(make_request(prompt_of(4), max_tokens=30))
    young = driver.submit(make_request(prompt_of(4, salt=1), max_tokens=30))
    driver.run()
    rid = young.request.request_id
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"pause request_id={rid} ") and "pages_freed=" in m
               for m in messages)
    assert any(m.startswith(f"restore request_id={rid} ") for m in messages)
    assert any(m.startswith(f"replay complete request_id={rid} ") for m in messages)
