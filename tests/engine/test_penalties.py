"""Presence/frequency penalties through the scheduler and the fake runner: the device's
output counts (engine/penalty_lanes.py) equal the committed output at every sample, while
penalised rows ride the launch-ahead pipeline (no sit-out), alone, together, across pauses,
early ends whose extra token is dropped, token policies and cancellations."""
from __future__ import annotations

import pytest

from ninfer_jax.engine.request import SamplingParams
from tests.engine.engine_testkit import (
    Driver, drain, expected_output, finished, make_request, prompt_of,
)

PRESENCE = SamplingParams(temperature=0.0, presence_penalty=0.5)
FREQUENCY_SEEDED = SamplingParams(temperature=0.8, seed=11, frequency_penalty=0.25)
BOTH = SamplingParams(temperature=0.0, presence_penalty=-1.0, frequency_penalty=1.5)


def test_a_penalised_row_rides_the_pipeline_and_its_counts_follow_its_output():
    driver = Driver(max_concurrency=1)
    request = make_request(prompt_of(9), max_tokens=30, sampling=PRESENCE)
    [result] = driver.run_all([request])
    assert list(result.output_ids) == expected_output(prompt_of(9), 30, sampling=PRESENCE)
    assert list(result.output_ids) != expected_output(prompt_of(9), 30)  # the penalty bites
    rows = [row for plan in driver.schedules for row in plan.rows]
    # One row per step after the first token, each fed from the step before it on the
    # device: the row never sat out while its token was pending.
    assert len(rows) == 29 and len(driver.schedules) == 30
    assert all(row.from_previous is not None for row in rows)
    assert {row.sample.penalty_lane for row in rows} == {1}
    assert driver.schedules[0].penalty_loads[0].lane == 1
    assert sum(len(plan.penalty_loads) for plan in driver.schedules) == 1


@pytest.mark.parametrize("overlap", [True, False])
def test_concurrent_penalised_and_plain_requests_each_get_their_own_output(overlap):
    driver = Driver(max_concurrency=4, overlap=overlap)
    samplings = [PRESENCE, FREQUENCY_SEEDED, BOTH, SamplingParams(temperature=0.0)]
    requests = [make_request(prompt_of(5 + 3 * i, i), max_tokens=25, sampling=s)
                for i, s in enumerate(samplings)]
    results = driver.run_all(requests)
    for request, result in zip(requests, results):
        assert list(result.output_ids) == expected_output(request.prompt_ids, 25,
                                                          sampling=request.sampling)
    lanes = {row.seq_id: row.sample.penalty_lane for plan in driver.schedules
             for row in plan.rows}
    assert sorted(lanes.values()) == [0, 1, 2, 3]  # the plain request reads the dummy lane


@pytest.mark.parametrize("host_pages", [0, 64])  # paused by replay, or by snapshot
def test_paused_and_restored_requests_reload_their_lane_from_the_committed_output(host_pages):
    driver = Driver(num_pages=14, max_concurrency=3, host_pages=host_pages, prefix_reuse=True)
    samplings = [PRESENCE, FREQUENCY_SEEDED, BOTH]
    requests = [make_request(prompt_of(8, i), max_tokens=20, sampling=s)
                for i, s in enumerate(samplings)]
    results = driver.run_all(requests)
    assert sum(r.counters["preemptions"] for r in results) > 0
    for request, result in zip(requests, results):
        assert list(result.output_ids) == expected_output(request.prompt_ids, 20,
                                                          sampling=request.sampling)
    # every restore loaded its lane again, from the output it had committed
    restores = sum(r.counters["replay_restores"] + r.counters["snapshot_restores"]
                   for r in results)
    loads = [load for plan in driver.schedules for load in plan.penalty_loads]
    assert len(loads) == 3 + restores
    assert any(load.output_ids for load in loads)


def test_a_lane_whose_request_ended_with_a_token_in_flight_is_reloaded_for_the_next():
    """The first request stops on a token while its next row is already launched: that row's
    sample is counted in lane 1 and dropped at collect. The next request takes lane 1 with
    the same prompt and penalties, so a stale count would change its first tokens."""
    prompt = prompt_of(7, 3)
    full = expected_output(prompt, 12, sampling=BOTH)
    stop = full[4]
    assert stop not in full[:4]
    driver = Driver(max_concurrency=1)
    first = make_request(prompt, max_tokens=12, sampling=BOTH, stop_token_ids=(stop,))
    second = make_request(prompt, max_tokens=12, sampling=BOTH)
    results = driver.run_all([first, second])
    assert list(results[0].output_ids) == full[:5] and results[0].reason == "stop"
    assert list(results[1].output_ids) == full
    first_rows = [row for plan in driver.schedules for row in plan.rows if row.seq_id == 0]
    assert len(first_rows) == 5  # four committed tokens came from rows, one was dropped
    assert [load.lane for plan in driver.schedules for load in plan.penalty_loads] == [1, 1]


def test_a_token_policy_that_replaces_samples_reloads_the_lane_after_each_commit():
    class Doubler:
        """Commits two tokens for every sample: the counts must follow what it commits."""

        def adjust(self, output_ids, sampled):
            return [sampled, (sampled + 1) % 1000]

    driver = Driver(max_concurrency=2)
    request = make_request(prompt_of(6, 5), max_tokens=16, sampling=PRESENCE,
                           token_policy=Doubler())
    plain = make_request(prompt_of(6, 6), max_tokens=16, sampling=FREQUENCY_SEEDED)
    results = driver.run_all([request, plain])
    forced = lambda output, token: Doubler().adjust(output, token)  # noqa: E731
    assert list(results[0].output_ids) == expected_output(
        request.prompt_ids, 16, sampling=PRESENCE, forced=forced)
    assert list(results[1].output_ids) == expected_output(plain.prompt_ids, 16,
                                                          sampling=FREQUENCY_SEEDED)


def test_cancelling_a_penalised_request_gives_its_lane_back():
    driver = Driver(max_concurrency=2)
    handle = driver.submit(make_request(prompt_of(5), max_tokens=200, sampling=PRESENCE))
    for _ in range(6):
        driver.step()
    assert driver.scheduler.penalty_lanes.num_used == 1
    handle.cancel()
    later = driver.submit(make_request(prompt_of(5), max_tokens=10, sampling=PRESENCE))
    driver.run()
    assert drain(handle)[-1].reason == "cancelled"
    assert list(finished(later).output_ids) == expected_output(prompt_of(5), 10,
                                                               sampling=PRESENCE)
    assert driver.scheduler.penalty_lanes.num_used == 0
