"""Several sequences' prefill chunks in one step (a runner with chunk_segments > 1).

A burst of prompts is admitted in a few steps (each chunk at most segment_tokens tokens
while it shares a step, up to prefill_chunk alone), and every request commits what it
commits alone: greedy and seeded, with a cut prompt, rows fed from chunk k's sample still on
the device, an end, a cancellation or a stop among the chunks, penalties, device token
policies, a hybrid's state slots and checkpoints, and page pressure."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.engine import Engine
from ninfer_jax.engine.fake import FakeRunner
from ninfer_jax.engine.policies import ThinkingBudget
from ninfer_jax.engine.request import MediaInput, SamplingParams
from ninfer_jax.engine.runner_api import (
    CHUNK_SLOT, DecodeRow, PrefillUnit, SampleSpec, StepPlan, chunk_index, chunk_slot,
)
from ninfer_jax.engine.step_loop import _describe_chunks

from engine_testkit import (
    GREEDY, VOCAB, Driver, expected_output, finished, make_request, prompt_of,
)

SEEDED = SamplingParams(temperature=0.8, seed=3)
PENALISED = SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.25)


def chunk_plans(driver):
    return [plan for plan in driver.schedules if plan.chunk is not None]


def solo(request, **driver_options):
    """The request's Finished when it runs alone (a fresh driver, one segment)."""
    options = dict(driver_options, chunk_segments=1)
    [end] = Driver(**options).run_all([make_request(
        request.prompt_ids, max_tokens=request.max_tokens, sampling=request.sampling,
        stop_token_ids=request.stop_token_ids)])
    return end


def test_chunk_slots_name_each_chunk_of_the_previous_plan():
    assert chunk_slot(0) == CHUNK_SLOT
    assert [chunk_index(chunk_slot(k)) for k in range(4)] == [0, 1, 2, 3]


def test_the_slow_submit_line_counts_every_chunk():
    def unit(seq_id, length):
        return PrefillUnit(seq_id, np.zeros(length, np.int32), 0, np.int32([1]), None)

    assert _describe_chunks(StepPlan(chunk=None)) == ""
    assert _describe_chunks(StepPlan(chunk=unit(0, 512))) == " and a 512-token chunk"
    several = StepPlan(chunk=unit(0, 512), more_chunks=(unit(1, 512), unit(2, 176)))
    assert _describe_chunks(several) == " and 3 chunks of 1200 tokens"


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED])
def test_a_burst_is_admitted_in_two_chunk_steps_and_each_output_is_its_solo_output(sampling):
    driver = Driver(max_concurrency=8, chunk_segments=4, segment_tokens=16)
    requests = [make_request(prompt_of(5 + i, salt=i), max_tokens=6, sampling=sampling)
                for i in range(8)]
    ends = driver.run_all(requests)
    plans = chunk_plans(driver)
    assert [len(plan.chunks) for plan in plans] == [4, 4]
    assert [[u.seq_id for u in plan.chunks] for plan in plans] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert all(u.start == 0 and len(u.tokens) == 5 + u.seq_id
               for plan in plans for u in plan.chunks)
    assert sum(step[0] == "prefill" for step in driver.runner.steps) == 8
    for request, end in zip(requests, ends):
        assert end.reason == "length"
        assert list(end.output_ids) == expected_output(request.prompt_ids, 6,
                                                       sampling=sampling)
        assert end.output_ids == solo(request).output_ids
        assert end.counters["prefill_units"] == 1
    assert driver.request_pages() == 0


def test_a_prompt_over_segment_tokens_is_cut_and_alone_takes_a_whole_chunk():
    driver = Driver(max_concurrency=3, chunk_segments=4, segment_tokens=8, prefill_chunk=32)
    prompts = [prompt_of(30, salt=0), prompt_of(5, salt=1), prompt_of(11, salt=2)]
    ends = driver.run_all([make_request(p, max_tokens=5) for p in prompts])
    units = [[(u.seq_id, u.start, len(u.tokens)) for u in plan.chunks]
             for plan in chunk_plans(driver)]
    # Shared steps cut every chunk to 8 tokens; the long prompt's rest runs alone, up to
    # prefill_chunk.
    assert units == [[(0, 0, 8), (1, 0, 5), (2, 0, 8)], [(0, 8, 8), (2, 8, 3)], [(0, 16, 14)]]
    for prompt, end in zip(prompts, ends):
        assert list(end.output_ids) == expected_output(prompt, 5)
    # each prompt's first token came from its last chunk, shared or not
    sampled = [(u.seq_id, u.start) for plan in chunk_plans(driver) for u in plan.chunks
               if u.sample is not None]
    assert sampled == [(1, 0), (2, 8), (0, 16)]


def test_rows_read_each_chunks_sample_on_the_device():
    """Async dispatch, launch-ahead: the step after a chunk step feeds every chunk's sample
    (chunk_slot(k)) to that sequence's first decode row before the host has seen it."""
    driver = Driver(max_concurrency=4, chunk_segments=4, async_dispatch=True, overlap=True)
    prompts = [prompt_of(3 + 2 * i, salt=i) for i in range(4)]
    ends = driver.run_all([make_request(p, max_tokens=5) for p in prompts])
    first, second = driver.schedules[:2]
    assert [u.seq_id for u in first.chunks] == [0, 1, 2, 3]
    assert {row.seq_id: row.from_previous for row in second.rows} == {
        k: chunk_slot(k) for k in range(4)}
    for prompt, end in zip(prompts, ends):
        assert list(end.output_ids) == expected_output(prompt, 5)


def test_fake_runner_resolves_a_later_chunks_sample_and_refuses_what_it_cannot_take():
    runner = FakeRunner(num_pages=8, page_size=4, vocab_size=VOCAB, async_dispatch=False,
                        chunk_segments=2, segment_tokens=4)
    spec = SampleSpec(GREEDY, 0)
    a, b = prompt_of(3), prompt_of(4, salt=1)
    units = [PrefillUnit(seq_id=i, tokens=np.int32(p), start=0,
                         page_table=np.int32([1 + 2 * i, 2 + 2 * i]), sample=spec)
             for i, p in enumerate((a, b))]
    result = runner.collect(runner.launch(StepPlan(chunk=units[0], more_chunks=(units[1],))))
    assert result.chunk_sample(0) == (expected_output(a, 1)[0], False)
    assert result.chunk_sample(1) == (expected_output(b, 1)[0], False)
    row = DecodeRow(seq_id=1, token=0, position=4, page_table=units[1].page_table,
                    sample=SampleSpec(GREEDY, 1), from_previous=chunk_slot(1))
    after = runner.collect(runner.launch(StepPlan(chunk=None, rows=(row,))))
    assert list(after.row_tokens) == expected_output(b, 2)[1:]
    too_long = PrefillUnit(seq_id=2, tokens=np.int32(prompt_of(5)), start=0,
                           page_table=np.int32([5, 6]), sample=spec)
    with pytest.raises(ValueError, match="5-token chunk among 2"):
        runner.launch(StepPlan(chunk=units[0], more_chunks=(too_long,)))
    runner.launch(StepPlan(chunk=too_long))  # alone it is an ordinary chunk
    with pytest.raises(ValueError, match="3 chunks"):
        runner.launch(StepPlan(chunk=units[0], more_chunks=(units[1], units[1])))
    one = FakeRunner(num_pages=8, page_size=4, vocab_size=VOCAB, async_dispatch=False)
    with pytest.raises(ValueError, match="2 chunks"):
        one.launch(StepPlan(chunk=units[0], more_chunks=(units[1],)))


def test_one_segment_keeps_one_chunk_per_step():
    driver = Driver(max_concurrency=8)
    prompts = [prompt_of(5 + i, salt=i) for i in range(8)]
    ends = driver.run_all([make_request(p, max_tokens=4) for p in prompts])
    plans = chunk_plans(driver)
    assert len(plans) == 8 and all(plan.more_chunks == () for plan in plans)
    for prompt, end in zip(prompts, ends):
        assert list(end.output_ids) == expected_output(prompt, 4)


def media_request(salt: int):
    """A 10-token prompt with one image of 4 placeholders (the fake runs them as text)."""
    prompt = prompt_of(10, salt=salt)
    prompt[3:7] = [900] * 4
    image = MediaInput("image", f"digest-{salt}", (1, 4, 4), ((3, 4),), pixel_values=None)
    return make_request(prompt, max_tokens=4, media=(image,))


@pytest.mark.parametrize("media_first", [True, False])
def test_a_prompt_with_media_shares_no_step(media_first):
    requests = [make_request(prompt_of(6 + i, salt=i), max_tokens=4) for i in range(3)]
    requests.insert(0 if media_first else 1, media_request(7))
    driver = Driver(max_concurrency=4, chunk_segments=4)
    ends = driver.run_all(requests)
    units = [[u.seq_id for u in plan.chunks] for plan in chunk_plans(driver)]
    assert units == ([[0], [1, 2, 3]] if media_first else [[0, 2, 3], [1]])
    assert all(u.media is not None for plan in chunk_plans(driver) for u in plan.chunks
               if u.seq_id == (0 if media_first else 1))
    for request, end in zip(requests, ends):
        assert list(end.output_ids) == expected_output(request.prompt_ids, 4)


def test_an_engine_takes_its_runners_segments():
    runner = FakeRunner(num_pages=64, page_size=4, vocab_size=VOCAB, chunk_segments=4,
                        segment_tokens=16)
    engine = Engine(runner, EngineConfig(max_concurrency=4))
    assert (engine.scheduler.chunk_segments, engine.scheduler.segment_tokens) == (4, 16)
    legacy = FakeRunner(num_pages=64, page_size=4, vocab_size=VOCAB)
    del legacy.chunk_segments, legacy.segment_tokens  # a runner that predates segments
    assert Engine(legacy, EngineConfig()).scheduler.chunk_segments == 1


def test_an_end_a_cancellation_and_a_stop_among_the_chunks_leave_the_others_exact():
    prompts = [prompt_of(6 + i, salt=i) for i in range(6)]
    stop = expected_output(prompts[3], 1)[0]  # request 3 stops at its first token
    driver = Driver(max_concurrency=6, chunk_segments=3, eos_ids=[stop])
    requests = [make_request(p, max_tokens=0 if i == 1 else 8) for i, p in enumerate(prompts)]
    handles = [driver.submit(r) for r in requests]
    assert driver.step()  # the first chunk step is in flight
    handles[2].cancel()  # while its sample is pending on the device
    driver.run()
    ends = [finished(h) for h in handles]
    assert [len(plan.chunks) for plan in chunk_plans(driver)] == [3, 3]
    assert ends[1].reason == "length" and ends[1].output_ids == ()
    assert ends[2].reason == "cancelled"
    assert ends[3].reason == "stop" and list(ends[3].output_ids) == [stop]
    for i in (0, 4, 5):
        assert list(ends[i].output_ids) == expected_output(prompts[i], 8, stop=(stop,))
        assert ends[i].output_ids == solo(requests[i], eos_ids=[stop]).output_ids
    assert driver.request_pages() == 0


def test_penalties_and_device_policies_apply_to_every_chunks_sample():
    """Each chunk's sample goes through its own lane (counts, automaton, forced flag)."""
    def policy():
        return ThinkingBudget(budget=0, open_id=950, close_id=951, suffix_ids=[900, 951],
                              starts_in_reasoning=True, max_tokens=12, stop_ids=frozenset())

    driver = Driver(max_concurrency=4, chunk_segments=4, overlap=False)
    requests = [make_request(prompt_of(4, salt=0), max_tokens=12),
                make_request(prompt_of(5, salt=1), max_tokens=12, token_policy=policy()),
                make_request(prompt_of(6, salt=2), max_tokens=12, sampling=PENALISED),
                make_request(prompt_of(7, salt=3), max_tokens=12, token_policy=policy(),
                             sampling=SEEDED)]
    handles = [driver.submit(r) for r in requests]
    while driver.step():
        # each step is collected before the next: every host mirror is at its lane's state
        for seq in driver.scheduler.resident:
            if seq.device_policy is not None:
                mirror = seq.device_policy.node, seq.device_policy.counter
                assert tuple(driver.runner.policy_table[seq.penalty_lane, :2]) == mirror
    ends = [finished(h) for h in handles]
    assert [len(plan.chunks) for plan in chunk_plans(driver)] == [4]
    for request, end in zip(requests, ends):
        forced = policy().adjust if request.token_policy is not None else None
        assert list(end.output_ids) == expected_output(
            request.prompt_ids, 12, sampling=request.sampling, forced=forced)
    # forced from the chunk's sample on (the first chunk's and a later one's)
    assert ends[1].output_ids[:2] == ends[3].output_ids[:2] == (900, 951)
    # the host mirror saw the step's forced flag of each chunk's sample
    assert requests[1].token_policy.applied == requests[3].token_policy.applied == 1


def test_hybrid_state_slots_and_checkpoints_with_shared_steps():
    prompts = [prompt_of(13 + 3 * i, salt=i) for i in range(4)]
    driver = Driver(state_slots=8, max_concurrency=4, chunk_segments=4, segment_tokens=8)
    ends = driver.run_all([make_request(p, max_tokens=6) for p in prompts])
    assert max(len(plan.chunks) for plan in driver.schedules) == 4
    for prompt, end in zip(prompts, ends):
        assert list(end.output_ids) == expected_output(prompt, 6, hybrid=True)
    assert driver.scheduler.checkpoints.num_checkpoints > 0
    # A second burst with the same prompts starts from the checkpoints.
    again = driver.run_all([make_request(p, max_tokens=6) for p in prompts])
    for prompt, end in zip(prompts, again):
        assert end.usage.cached_tokens > 0
        assert list(end.output_ids) == expected_output(prompt, 6, hybrid=True)


@pytest.mark.parametrize("overlap", [True, False])
def test_page_pressure_with_several_chunks_wanted_pauses_and_replays_exactly(overlap):
    driver = Driver(num_pages=14, page_size=4, max_concurrency=6, chunk_segments=4,
                    segment_tokens=8, overlap=overlap)
    prompts = [prompt_of(9 + i, salt=i) for i in range(6)]
    handles = [driver.submit(make_request(p, max_tokens=16)) for p in prompts]
    driver.run()
    ends = [finished(h) for h in handles]
    for prompt, end in zip(prompts, ends):
        assert end.reason == "length"
        assert list(end.output_ids) == expected_output(prompt, 16)
    assert max(len(plan.chunks) for plan in driver.schedules) > 1
    assert driver.scheduler.counters.preemptions > 0
    assert ends[0].counters["preemptions"] == 0  # the oldest always progressed
    assert driver.request_pages() == 0


@pytest.mark.parametrize("overlap", [True, False])
def test_a_chunks_sequence_paused_by_an_older_ones_reservation_is_planned_again(overlap):
    """Three decoders outgrow a tight pool while two prompts share chunk steps: a decoder's
    reservation pauses the youngest chunk's sequence before that one reserved, so the
    plan is made again without it (planning its chunk would run a paused sequence)."""
    driver = Driver(num_pages=12, page_size=4, max_concurrency=5, chunk_segments=3,
                    segment_tokens=2, prefill_chunk=4, prefix_reuse=False, overlap=overlap)
    paused = []
    driver.scheduler.life.listeners.append(
        lambda event: paused.append(event.seq_id) if event.kind == "paused" else None)
    requests = [make_request(prompt_of(3 + i, salt=10 + i), max_tokens=30) for i in range(3)]
    handles = [driver.submit(r) for r in requests]
    for _ in range(3):
        assert driver.step()
    requests += [make_request(prompt_of(8, salt=s), max_tokens=4) for s in (1, 2)]
    handles += [driver.submit(r) for r in requests[3:]]
    driver.run()
    for request, handle in zip(requests, handles):
        assert list(finished(handle).output_ids) == expected_output(request.prompt_ids,
                                                                    request.max_tokens)
    assert 4 in paused and max(len(plan.chunks) for plan in driver.schedules) >= 2
    assert driver.request_pages() == 0
