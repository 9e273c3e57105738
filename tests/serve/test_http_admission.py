"""Every dialect waits for admission before it answers (generation.start): overload and queue
timeout are plain HTTP errors before any byte of a stream, and a client that leaves while
its request is queued, or while it waits for an aggregate reply, gets the request cancelled.

A `socket.socketpair()` end passed as `gunicorn.socket` stands in for the client connection
the gthread worker exposes; closing the other end is the client going away."""
import socket
import threading
import time

import pytest
from falcon import testing

from harness import build_harness, wait_for
from ninfer_jax.engine.request import GenerationRequest, SamplingParams

MODEL = "smollm2-135m-instruct"


def chat(content, n, **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": n, **extra}


def completion(content, n, **extra):
    return {"model": MODEL, "prompt": content, "max_tokens": n, **extra}


def response(content, n, **extra):
    return {"model": MODEL, "input": content, "max_output_tokens": n, **extra}


def message(content, n, **extra):
    return {"model": MODEL, "max_tokens": n, "messages": [{"role": "user", "content": content}],
            **extra}


DIALECTS = {
    "chat": ("/v1/chat/completions", chat),
    "completions": ("/v1/completions", completion),
    "responses": ("/v1/responses", response),
    "anthropic": ("/v1/messages", message),
}
# (queue timeout, overload) statuses: Anthropic has its own two.
STATUSES = {"chat": (503, 429), "completions": (503, 429), "responses": (503, 429),
            "anthropic": (504, 529)}


def hold_lane(h, max_tokens=2000):
    """Submit straight to the engine: a request that keeps the only lane busy until cancelled."""
    request = GenerationRequest("holder", [1, 2, 3], SamplingParams(temperature=0),
                                max_tokens, ignore_eos=True)
    handle = h.engine.submit(request)
    deadline = time.monotonic() + 5
    while h.engine.stats().running == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return handle


def error_code(result, dialect):
    body = result.json
    return body["error"]["type"] if dialect == "anthropic" else body["error"]["code"]


@pytest.fixture(scope="module")
def one_lane(default_artifact, default_tokenizer):
    """One lane, one pending slot, a short admission deadline, slow decoding."""
    h = build_harness(default_artifact, default_tokenizer, max_context=2048, decode_sleep=0.01,
                      pending_timeout_ms=250, engine_options={"lanes": 1, "pending": 1})
    yield h
    h.close()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stream_queue_timeout_and_overload_are_http_errors(one_lane, dialect):
    path, build = DIALECTS[dialect]
    timeout_status, overload_status = STATUSES[dialect]
    client = testing.TestClient(one_lane.app)
    holder = hold_lane(one_lane)
    try:
        timed_out = client.simulate_post(path, json=build("waits", 4, stream=True))
        assert timed_out.status_code == timeout_status
        assert timed_out.headers["content-type"].startswith("application/json")
        assert error_code(timed_out, dialect) in ("request_queue_timeout", "timeout_error")
        # A second request submitted straight to the engine takes the one pending slot.
        waiting = one_lane.engine.submit(GenerationRequest(
            "waiter", [4, 5], SamplingParams(), 4, deadline=time.monotonic() + 30))
        try:
            overloaded = client.simulate_post(path, json=build("no room", 4, stream=True))
            assert overloaded.status_code == overload_status
            assert overloaded.headers["content-type"].startswith("application/json")
            assert error_code(overloaded, dialect) in ("server_overloaded", "overloaded_error")
        finally:
            waiting.cancel()
    finally:
        holder.cancel()
        assert wait_for(lambda: one_lane.engine.stats().running == 0)


@pytest.fixture(scope="module")
def patient(default_artifact, default_tokenizer):
    """One lane and a long admission deadline: a queued request waits until it is cancelled."""
    h = build_harness(default_artifact, default_tokenizer, max_context=2048, decode_sleep=0.01,
                      pending_timeout_ms=20000, engine_options={"lanes": 1, "pending": 4})
    h.book.add("ramble", "la", end=False)
    yield h
    h.close()


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True])
def test_client_gone_while_queued_never_starts(patient, dialect, stream):
    path, build = DIALECTS[dialect]
    client = testing.TestClient(patient.app)
    holder = hold_lane(patient)
    server_end, client_end = socket.socketpair()
    try:
        before = patient.engine.stats()
        client_end.close()  # the client is gone before its request could be admitted
        started = time.monotonic()
        result = client.simulate_post(path, json=build("queued", 8, stream=stream),
                                      extras={"gunicorn.socket": server_end})
        assert result.status_code == 499 and result.text == ""
        assert time.monotonic() - started < 5  # noticed long before the 20 s deadline
        # The engine publishes its stats snapshot right after the round that ended it.
        assert wait_for(lambda: patient.engine.stats().requests["cancelled"]
                        == before.requests["cancelled"] + 1)
        after = patient.engine.stats()
        assert after.prompt_tokens == before.prompt_tokens  # it was never admitted
        assert after.running == 1  # the lane holder runs on
    finally:
        server_end.close()
        holder.cancel()
        assert wait_for(lambda: patient.engine.stats().running == 0)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_client_gone_during_aggregate_cancels(patient, dialect):
    path, build = DIALECTS[dialect]
    client = testing.TestClient(patient.app)
    server_end, client_end = socket.socketpair()
    before = patient.engine.stats()
    done = {}
    thread = threading.Thread(target=lambda: done.setdefault("result", client.simulate_post(
        path, json=build("SCRIPT:ramble", 1000), extras={"gunicorn.socket": server_end})))
    thread.start()
    try:
        assert wait_for(lambda: patient.engine.stats().generation_tokens
                        >= before.generation_tokens + 5)
        client_end.close()
        thread.join(5)
        assert not thread.is_alive()
        assert wait_for(lambda: patient.engine.stats().requests["cancelled"]
                        == before.requests["cancelled"] + 1)
        after = patient.engine.stats()
        assert after.generation_tokens - before.generation_tokens < 500
        assert after.running == 0
    finally:
        server_end.close()
        thread.join(30)


def test_without_a_socket_nothing_is_watched(patient):
    """Falcon's TestClient has no client socket: a plain request runs to its end."""
    client = testing.TestClient(patient.app)
    result = client.simulate_post("/v1/chat/completions", json=chat("SCRIPT:ramble", 12))
    assert result.status_code == 200
    assert result.json["usage"]["completion_tokens"] == 12
