"""Scheduler behaviour with the fake model, driven round by round (no thread, no JAX)."""
from ninfer_jax.engine.request import (
    Admitted, Failed, Finished, PromptProgress, SamplingParams, Tokens,
)
from ninfer_jax.errors import QueueTimeout

from engine_testkit import (
    Driver, drain, expected_output, finished, make_request, prompt_of, terminal,
)


def test_single_request_events_and_output():
    driver = Driver(prefill_chunk=4)
    prompt = prompt_of(10)
    handle = driver.submit(make_request(prompt, max_tokens=5))
    driver.run()
    events = drain(handle)
    assert isinstance(events[0], Admitted) and events[0].cache_n == 0
    progress = [e.processed for e in events if isinstance(e, PromptProgress)]
    assert progress == [4, 8, 10]  # one per prefill unit of at most 4 tokens
    tokens = [t for e in events if isinstance(e, Tokens) for t in e.ids]
    end = terminal(events)
    assert tokens == list(end.output_ids) == expected_output(prompt, 5)
    assert end.reason == "length"
    assert (end.usage.prompt_tokens, end.usage.completion_tokens) == (10, 5)
    assert end.counters["prefill_units"] == 3 and end.counters["decode_rounds"] == 4
    assert driver.request_pages() == 0
    units = [(s.chunk.start, len(s.chunk.tokens)) for s in driver.schedules if s.chunk]
    assert units == [(0, 4), (4, 4), (8, 2)]


def test_prompt_only_request_processes_the_prompt_and_samples_nothing():
    driver = Driver()
    handle = driver.submit(make_request(prompt_of(6), max_tokens=0))
    driver.run()
    events = drain(handle)
    assert not [e for e in events if isinstance(e, Tokens)]
    end = terminal(events)
    assert end.reason == "length" and end.output_ids == ()
    assert all(s.chunk.sample is None for s in driver.schedules)


def test_stop_token_ends_with_stop_and_is_counted():
    prompt = prompt_of(5)
    reference = expected_output(prompt, 10)
    eos = reference[3]
    driver = Driver(eos_ids=[eos])
    handle = driver.submit(make_request(prompt, max_tokens=10))
    driver.run()
    end = finished(handle)
    assert end.reason == "stop" and end.matched_stop_token == eos
    assert list(end.output_ids) == reference[: reference.index(eos) + 1]


def test_ignore_eos_runs_to_the_limit():
    prompt = prompt_of(5)
    reference = expected_output(prompt, 10)
    driver = Driver(eos_ids=[reference[1]])
    handle = driver.submit(make_request(prompt, max_tokens=10, ignore_eos=True))
    driver.run()
    end = finished(handle)
    assert end.reason == "length" and list(end.output_ids) == reference


def test_ignore_eos_keeps_the_request_stop_token_ids():
    """A client's stop_token_ids stay active under ignore_eos, as its stop strings do."""
    prompt = prompt_of(5)
    reference = expected_output(prompt, 10)
    stop = next(t for t in reference[2:] if t != reference[1])
    driver = Driver(eos_ids=[reference[1]])
    handle = driver.submit(make_request(prompt, max_tokens=10, ignore_eos=True,
                                        stop_token_ids=frozenset({stop})))
    driver.run()
    end = finished(handle)
    assert end.reason == "stop" and end.matched_stop_token == stop
    assert list(end.output_ids) == reference[: reference.index(stop) + 1]


def test_request_stop_token_ids_stop_too():
    prompt = prompt_of(5)
    reference = expected_output(prompt, 10)
    driver = Driver()
    handle = driver.submit(make_request(prompt, max_tokens=10,
                                        stop_token_ids=frozenset({reference[2]})))
    driver.run()
    assert list(finished(handle).output_ids) == reference[:3]


def test_context_ceiling_finishes_with_length():
    driver = Driver(max_context=12)
    handle = driver.submit(make_request(prompt_of(8), max_tokens=100))
    driver.run()
    end = finished(handle)
    assert end.reason == "length" and len(end.output_ids) == 4


class InsertAfterThird:
    """Forces two control tokens after the third output token (depends only on the output)."""

    def adjust(self, output_ids, sampled):
        return [sampled, 900, 901] if len(output_ids) == 2 else [sampled]


def test_token_policy_inserts_tokens_and_prefill_fills_the_gap():
    prompt = prompt_of(7)
    driver = Driver(prefill_chunk=16)
    handle = driver.submit(make_request(prompt, max_tokens=10, token_policy=InsertAfterThird()))
    driver.run()
    end = finished(handle)
    policy = InsertAfterThird()
    assert list(end.output_ids) == expected_output(prompt, 10, forced=policy.adjust)
    assert end.output_ids[3:5] == (900, 901)
    # The forced tokens (positions 7+3 .. 7+4) got their KV from a prefill unit.
    gap_units = [s.chunk for s in driver.schedules if s.chunk and s.chunk.start > 0]
    assert [(u.start, len(u.tokens), u.sample) for u in gap_units] == [(9, 2, None)]


def test_stop_at_truncates_and_finishes_with_stop():
    prompt = prompt_of(5)
    driver = Driver()
    handle = driver.submit(make_request(prompt, max_tokens=20))
    for _ in range(5):
        driver.step()
    handle.stop_at(2)
    driver.run()
    end = finished(handle)
    assert end.reason == "stop" and list(end.output_ids) == expected_output(prompt, 2)
    assert end.usage.completion_tokens == 2
    assert driver.request_pages() == 0


def test_cancel_while_running_frees_pages():
    driver = Driver()
    handle = driver.submit(make_request(prompt_of(9), max_tokens=50))
    for _ in range(4):
        driver.step()
    assert driver.request_pages() > 0
    handle.cancel()
    handle.cancel()  # idempotent
    driver.run()
    end = finished(handle)
    assert end.reason == "cancelled" and 0 < len(end.output_ids) < 50
    assert driver.request_pages() == 0


def test_cancelled_waiting_request_never_starts():
    driver = Driver(max_concurrency=1)
    first = driver.submit(make_request(prompt_of(4), max_tokens=3))
    second = driver.submit(make_request(prompt_of(4, salt=1), max_tokens=3))
    driver.step()
    second.cancel()
    driver.run()
    assert finished(first).reason == "length"
    events = drain(second)
    assert [type(e) for e in events] == [Finished] and events[0].reason == "cancelled"
    started = {s.chunk.seq_id for s in driver.schedules if s.chunk}
    assert started == {0}


def test_queue_deadline_fails_with_queue_timeout():
    driver = Driver(max_concurrency=1)
    driver.submit(make_request(prompt_of(4), max_tokens=3))
    late = driver.submit(make_request(prompt_of(4, salt=1), max_tokens=3, deadline=0.0))
    driver.run()
    events = drain(late)
    assert len(events) == 1 and isinstance(events[0], Failed)
    assert isinstance(events[0].error, QueueTimeout)
    assert driver.scheduler.counters.requests["timeout"] == 1


def test_admission_is_fifo():
    driver = Driver(max_concurrency=1)
    handles = [driver.submit(make_request(prompt_of(3, salt=i), max_tokens=2)) for i in range(4)]
    driver.run()
    admitted_at = [next(e.time for e in drain(h) if isinstance(e, Admitted)) for h in handles]
    assert admitted_at == sorted(admitted_at)
    order = [s.chunk.seq_id for s in driver.schedules if s.chunk]
    assert order == [0, 1, 2, 3]


def test_decode_batches_are_compact_and_bounded():
    driver = Driver(max_concurrency=3)
    lengths = [2, 6, 4, 3, 5]
    handles = [driver.submit(make_request(prompt_of(3 + i, salt=i), max_tokens=n))
               for i, n in enumerate(lengths)]
    driver.run()
    for i, (handle, n) in enumerate(zip(handles, lengths)):
        assert list(finished(handle).output_ids) == expected_output(prompt_of(3 + i, salt=i), n)
    sizes = [len(s.rows) for s in driver.schedules if s.rows]
    assert max(sizes) == 3 and min(sizes) >= 1
    for schedule in driver.schedules:
        if schedule.rows:  # every row is a live, decode-ready sequence, oldest first
            ids = [row.seq_id for row in schedule.rows]
            assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_seeded_sampling_is_the_same_alone_and_batched():
    sampling = SamplingParams(temperature=0.8, seed=1234)
    prompt = prompt_of(6, salt=9)
    alone = Driver()
    solo = alone.submit(make_request(prompt, max_tokens=6, sampling=sampling))
    alone.run()
    batched = Driver(max_concurrency=4)
    others = [batched.submit(make_request(prompt_of(5, salt=i), max_tokens=6)) for i in range(2)]
    mine = batched.submit(make_request(prompt, max_tokens=6, sampling=sampling))
    batched.run()
    mine_output = finished(mine).output_ids
    assert finished(solo).output_ids == mine_output
    assert list(mine_output) == expected_output(prompt, 6, sampling=sampling)
    assert mine_output != tuple(expected_output(prompt, 6))  # sampling did change tokens
    assert all(finished(h).reason == "length" for h in others)


class Broken:
    def adjust(self, output_ids, sampled):
        if len(output_ids) == 2:
            raise KeyError("bug in a policy")
        return [sampled]


def test_a_failing_token_policy_fails_only_its_request():
    driver = Driver(max_concurrency=2)
    broken = driver.submit(make_request(prompt_of(4), max_tokens=6, token_policy=Broken()))
    healthy = driver.submit(make_request(prompt_of(4, salt=1), max_tokens=6))
    driver.run()
    end = terminal(drain(broken))
    assert isinstance(end, Failed) and end.error.status == 500
    assert list(finished(healthy).output_ids) == expected_output(prompt_of(4, salt=1), 6)
    assert driver.request_pages() == 0
