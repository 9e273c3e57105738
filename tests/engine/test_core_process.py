"""EngineClient against a real engine-core process running Engine(FakeRunner).

Every test spawns its core the way the launcher does (core_testkit.start_fake_core), so the
socket protocol, pickling, the sender's batching and process death are all real.
"""
import json
import logging
import os
import pickle
import signal
import time

import pytest

from ninfer_jax.artifact.format import load_artifact
from ninfer_jax.engine.core_client import EngineClient
from ninfer_jax.engine.lifecycle import SchedulingEvent
from ninfer_jax.engine.request import Admitted, Failed, Finished, SamplingParams, Tokens
from ninfer_jax.errors import (
    ContextLengthExceeded, EngineUnavailable, InvalidRequest, Overloaded,
)
from ninfer_jax.engine.policies import BlankToken, PolicyChain, ThinkingBudget

from core_testkit import compiling_in_background, env_probe, start_fake_core
from engine_testkit import expected_output, make_request, prompt_of


@pytest.fixture
def core_factory():
    cores, clients = [], []

    def start(**options):
        core = start_fake_core(**options)
        cores.append(core)
        return core

    def connect(core):
        client = EngineClient(core.address, core.authkey)
        clients.append(client)
        client.wait_built(30)
        assert client.wait_ready(30)
        return client

    yield start, connect
    for client in clients:
        client.shutdown()
    for core in cores:
        core.stop()


@pytest.fixture
def client(core_factory):
    start, connect = core_factory
    return connect(start())


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_stream_matches_the_fake_model_and_stats_follow(client):
    assert client.pool_tokens == 63 * 4 and client.config.max_concurrency == 4
    handles = [client.submit(make_request(prompt_of(5, salt=i), max_tokens=6 + i))
               for i in range(3)]
    for i, handle in enumerate(handles):
        events = list(handle.events())
        assert isinstance(events[0], Admitted)
        streamed = [t for e in events if isinstance(e, Tokens) for t in e.ids]
        expected = expected_output(prompt_of(5, salt=i), 6 + i)
        assert streamed == expected
        assert events[-1].reason == "length" and list(events[-1].output_ids) == expected
    assert wait_for(lambda: client.stats().requests["length"] == 3)
    stats = client.stats()
    assert stats.ready and stats.healthy and stats.generation_tokens == 6 + 7 + 8
    assert client.healthy


def test_synchronous_refusals_are_raised_by_submit(core_factory):
    start, connect = core_factory
    client = connect(start(lanes=1, pending=0, decode_sleep=0.05))
    with pytest.raises(ContextLengthExceeded) as error:
        client.submit(make_request(prompt_of(200), max_tokens=100))
    assert error.value.num_tokens == 300 and error.value.max_context == 256
    with pytest.raises(InvalidRequest):
        client.submit(make_request([], max_tokens=4))
    running = client.submit(make_request(prompt_of(4), max_tokens=200))
    with pytest.raises(Overloaded):
        client.submit(make_request(prompt_of(4), max_tokens=4))
    running.cancel()
    assert list(running.events())[-1].reason == "cancelled"


def test_cancel_and_stop_at_travel_to_the_core(core_factory):
    start, connect = core_factory
    client = connect(start(decode_sleep=0.01))
    long = client.submit(make_request(prompt_of(4), max_tokens=200))
    stopped = client.submit(make_request(prompt_of(4, salt=1), max_tokens=200))
    stopped.stop_at(3)
    while not isinstance(long.next_event(5), Tokens):
        pass
    long.cancel()
    end = list(long.events())[-1]
    assert end.reason == "cancelled" and len(end.output_ids) < 200
    end = list(stopped.events())[-1]
    assert end.reason == "stop"
    assert list(end.output_ids) == expected_output(prompt_of(4, salt=1), 3)


def test_two_workers_share_one_engine(core_factory):
    start, connect = core_factory
    core = start(lanes=1, pending=1, decode_sleep=0.02)
    first, second = connect(core), connect(core)
    running = first.submit(make_request(prompt_of(4), max_tokens=50))
    waiting = second.submit(make_request(prompt_of(4, salt=2), max_tokens=5))
    with pytest.raises(Overloaded):  # the capacity is the core's, across workers
        first.submit(make_request(prompt_of(4), max_tokens=5))
    assert list(waiting.events())[-1].output_ids == tuple(expected_output(prompt_of(4, salt=2),
                                                                         5))
    assert list(running.events())[-1].reason == "length"


def test_scheduling_events_reach_only_the_owning_worker(core_factory):
    start, connect = core_factory
    core = start(num_pages=11, page_size=4, lanes=4, prefill_chunk=4)
    owner, other = connect(core), connect(core)
    seen_by_owner, seen_by_other = [], []
    owner.add_scheduling_listener(seen_by_owner.append)
    other.add_scheduling_listener(seen_by_other.append)
    prompts = [prompt_of(6, salt=i) for i in range(4)]
    handles = [owner.submit(make_request(p, max_tokens=20)) for p in prompts]
    for prompt, handle in zip(prompts, handles):
        assert list(handle.events())[-1].output_ids == tuple(expected_output(prompt, 20))
    kinds = {event.kind for event in seen_by_owner}
    assert all(isinstance(e, SchedulingEvent) for e in seen_by_owner)
    assert {"paused", "restored"} <= kinds and not seen_by_other
    assert owner.stats().preemptions > 0


def test_core_death_fails_in_flight_requests_and_later_submits(core_factory):
    start, connect = core_factory
    core = start(decode_sleep=0.02)
    client = connect(core)
    handle = client.submit(make_request(prompt_of(4), max_tokens=200))
    assert isinstance(handle.next_event(5), Admitted)
    os.kill(core.process.pid, signal.SIGKILL)
    end = list(handle.events())[-1]
    assert isinstance(end, Failed) and isinstance(end.error, EngineUnavailable)
    assert wait_for(lambda: not client.healthy)
    with pytest.raises(EngineUnavailable):
        client.submit(make_request(prompt_of(4), max_tokens=4))


def test_engine_failure_inside_the_core_reaches_the_worker(core_factory):
    start, connect = core_factory
    client = connect(start(fail_at_step=2))
    end = list(client.submit(make_request(prompt_of(4), max_tokens=10)).events())[-1]
    assert isinstance(end, Failed) and isinstance(end.error, EngineUnavailable)
    assert wait_for(lambda: not client.healthy)


def test_warm_up_is_visible_as_not_ready(core_factory):
    start, _ = core_factory
    core = start(warmup_sleep=1.0)
    client = EngineClient(core.address, core.authkey)
    try:
        client.wait_built(30)
        assert not client.ready.is_set() and not client.stats().ready and client.healthy
        assert client.wait_ready(10) and client.stats().ready
    finally:
        client.shutdown()


def test_core_shutdown_fails_in_flight_requests(core_factory):
    start, connect = core_factory
    core = start(decode_sleep=0.02)
    client = connect(core)
    handle = client.submit(make_request(prompt_of(4), max_tokens=200))
    assert isinstance(handle.next_event(5), Admitted)
    core.stop()
    assert core.process.exitcode == 0
    end = list(handle.events())[-1]
    assert isinstance(end, Failed) and isinstance(end.error, EngineUnavailable)


def test_core_stops_while_a_background_compile_still_runs(core_factory):
    # Run 36: the H200 server's core outlived its stop by 15 s and was killed: at exit Python
    # joined the runner's compile pool, still compiling the remaining step shapes.
    start, connect = core_factory
    core = start(factory=compiling_in_background, seconds=600)
    connect(core)
    core.stop()
    assert core.process.exitcode == 0  # exited by itself, not killed (-9)


def test_a_core_reaped_by_someone_else_counts_as_stopped(core_factory, caplog):
    # gunicorn's master reaps every child on SIGCHLD, the core included; multiprocessing then
    # never learns its exit code and is_alive() stays True (run 36: every stop waited 15 s and
    # killed a core that was already gone).
    start, connect = core_factory
    core = start()
    connect(core)
    core.control.send("stop")
    os.waitpid(core.process.pid, 0)  # as gunicorn's SIGCHLD handler does
    assert core.process.is_alive()  # what misled stop()
    with caplog.at_level(logging.WARNING, logger="ninfer_jax.engine"):
        core.stop()
    assert "did not stop" not in caplog.text


def test_core_environment_is_applied_before_the_factory_runs(core_factory, tmp_path):
    start, connect = core_factory
    probe = tmp_path / "env.json"
    names = ("CUDA_VISIBLE_DEVICES", "XLA_FLAGS")
    env = {"CUDA_VISIBLE_DEVICES": "3", "XLA_FLAGS": "--x=1 --xla_gpu_enable_command_buffer="}
    connect(start(factory=env_probe, env=env, path=str(probe), names=names))
    assert json.loads(probe.read_text()) == env


def test_token_policies_pickle_and_report_back(client, default_artifact_path):
    tokenizer = load_artifact(default_artifact_path, weights=False).load_tokenizer()
    budget = ThinkingBudget(budget=2, open_id=None, close_id=7, suffix_ids=[5, 6, 7],
                            starts_in_reasoning=True, max_tokens=12,
                            is_blank=BlankToken(tokenizer))
    chain = PolicyChain([budget])
    copy = pickle.loads(pickle.dumps(chain))
    assert copy.policies[0].suffix_ids == [5, 6, 7]
    assert copy.policies[0]._is_blank(tokenizer.encode(" ", special=False)[0])
    prompt = prompt_of(5)
    request = make_request(prompt, max_tokens=12, token_policy=chain)
    end = list(client.submit(request).events())[-1]
    assert isinstance(end, Finished)
    assert list(end.output_ids[2:5]) == [5, 6, 7]  # forced in the core after two tokens
    assert budget.applied == 1  # the worker's own copy learned it from the terminal event


def test_sampled_requests_keep_their_seed_across_the_channel(client):
    sampling = SamplingParams(temperature=0.8, seed=42)
    end = list(client.submit(make_request(prompt_of(7), max_tokens=5,
                                          sampling=sampling)).events())[-1]
    assert list(end.output_ids) == expected_output(prompt_of(7), 5, sampling=sampling)
