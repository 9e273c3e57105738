"""Server-wide states: overload (429), queue timeout (503), engine failure (/health 503 and
engine_unavailable), loading, and CORS."""
import json
import threading

import pytest
from falcon import testing

from harness import build_harness, wait_for

MODEL = "smollm2-135m-instruct"


def body(content="SCRIPT:ramble", **fields):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


@pytest.fixture
def busy(default_artifact, default_tokenizer):
    """One lane, one waiting place, slow decoding, short admission deadline (long enough
    that the waiting request is still there when the overloading one arrives)."""
    h = build_harness(default_artifact, default_tokenizer, decode_sleep=0.01,
                      pending_timeout_ms=1000, engine_options={"lanes": 1, "pending": 1})
    h.book.add("ramble", "la", end=False)
    yield h
    h.close()


def start_in_background(client, payload):
    done = {}
    thread = threading.Thread(target=lambda: done.setdefault(
        "response", client.simulate_post("/v1/chat/completions", json=payload)))
    thread.start()
    return thread, done


def test_overload_is_429_and_queue_timeout_503(busy):
    client = testing.TestClient(busy.app)
    first, first_done = start_in_background(client, body(max_tokens=150))
    assert wait_for(lambda: busy.engine.stats().running == 1)
    second, second_done = start_in_background(client, body(max_tokens=5))
    # the waiting room is full once the engine holds the second request
    assert wait_for(lambda: busy.engine.stats().waiting == 1)
    third = client.simulate_post("/v1/chat/completions", json=body(max_tokens=5))
    assert third.status_code == 429
    assert third.json["error"]["code"] == "server_overloaded"
    assert third.json["error"]["type"] == "server_error"
    second.join(10)
    timeout = second_done["response"]
    assert timeout.status_code == 503
    assert timeout.json["error"]["code"] == "request_queue_timeout"
    first.join(30)
    assert first_done["response"].status_code == 200


def test_engine_failure_makes_health_unavailable(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer)
    client = testing.TestClient(h.app)
    assert client.simulate_get("/health").json["status"] == "ok"
    h.runner.fail_at_step = len(h.runner.steps)
    failed = client.simulate_post("/v1/chat/completions", json=body("hello", max_tokens=4))
    assert failed.status_code == 503
    assert failed.json["error"]["code"] == "engine_unavailable"
    health = client.simulate_get("/health")
    assert health.status_code == 503 and health.json["status"] == "unavailable"
    refused = client.simulate_post("/v1/chat/completions", json=body("hello", max_tokens=4))
    assert refused.status_code == 503
    h.close()


def test_stream_error_after_open_is_an_event(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer)
    client = testing.TestClient(h.app)
    h.runner.fail_at_step = len(h.runner.steps)
    response = client.simulate_post("/v1/chat/completions",
                                    json=body("hello", max_tokens=4, stream=True))
    assert response.status_code == 200 and response.headers["x-request-id"]
    events = [e for e in response.text.split("\n\n") if e]
    assert json.loads(events[-2][len("data: "):])["error"]["code"] == "engine_unavailable"
    assert events[-1] == "data: [DONE]"
    h.close()


def test_cors_headers_and_open_preflight(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, cors=True, api_key="k")
    client = testing.TestClient(h.app)
    preflight = client.simulate_options("/v1/chat/completions", headers={
        "Origin": "http://example.com", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"
    listing = client.simulate_get("/v1/models", headers={"Origin": "http://example.com",
                                                          "Authorization": "Bearer k"})
    assert listing.headers["access-control-allow-origin"] == "*"
    assert "x-request-id" in listing.headers["access-control-expose-headers"].lower()
    plain = build_harness(default_artifact, default_tokenizer)
    response = testing.TestClient(plain.app).simulate_get(
        "/v1/models", headers={"Origin": "http://example.com"})
    assert "access-control-allow-origin" not in response.headers
    h.close()
    plain.close()
