"""ninfer_response_failures_total over a real app (real Engine, scripted fake model), for
every dialect, streamed and not: a reply the server fails to render (or a Response it fails
to store) counts exactly once; before the engine's outcome it also ends the request as
`failed` (request_error, stage response), after it request_done stands. Validation errors,
token counts, successes, engine failures and clients that leave never count. An internal
error after a stream opened is logged once, with the request id."""
import json
import logging
import time

import pytest
from falcon import testing
from prometheus_client.parser import text_string_to_metric_families

from harness import abandon_stream, build_harness, by_id, read_log
from ninfer_jax.errors import InvalidRequest
from ninfer_jax.serve.anthropic import service as anthropic_service
from ninfer_jax.serve.core import output as core_output
from ninfer_jax.serve.openai import chat, completions
from ninfer_jax.serve.responses import service as responses_service
from ninfer_jax.serve.responses.store import ResponseStore
from sse_util import sse_chunks

DIALECTS = ("chat", "completions", "responses", "anthropic")
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
         "responses": "/v1/responses", "anthropic": "/v1/messages"}
# The dialect's own usage builder, called once the engine's outcome is in: failing it is a
# rendering failure after the outcome.
USAGE_BUILDERS = {"chat": (chat, "usage_body"), "completions": (completions, "usage_body"),
                  "responses": (responses_service, "usage_object"),
                  "anthropic": (anthropic_service, "usage_object")}


@pytest.fixture(scope="module")
def h(default_artifact, default_tokenizer, tmp_path_factory):
    log_file = tmp_path_factory.mktemp("failures") / "requests.jsonl"
    harness = build_harness(default_artifact, default_tokenizer, decode_sleep=0.005,
                            request_log_jsonl=str(log_file), log_stats_interval_ms=0)
    harness.book.add("reply", "Short reply here")
    harness.book.add("ramble", "la", end=False)
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def client(h):
    return testing.TestClient(h.app)


def counters(client) -> dict:
    """{"failures": response_failures_total, outcome: requests_total{outcome}}."""
    found = {}
    text = client.simulate_get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ninfer_response_failures_total":
                found["failures"] = sample.value
            elif sample.name == "ninfer_requests_total":
                found[sample.labels["outcome"]] = sample.value
    return found


def moved(before: dict, after: dict) -> dict:
    return {key: after[key] - before[key] for key in after if after[key] != before[key]}


def body_for(h, dialect: str, *, stream: bool, script: str = "reply", **extra) -> dict:
    content = f"SCRIPT:{script}"
    body = {"model": h.ctx.model_id, "stream": stream, "temperature": 0, **extra}
    if dialect == "completions":
        body.update(prompt=content, max_tokens=body.get("max_tokens", 24))
    elif dialect == "responses":
        body["input"] = content
        if "max_tokens" in body:
            body["max_output_tokens"] = body.pop("max_tokens")
    else:
        body["messages"] = [{"role": "user", "content": content}]
        body.setdefault("max_tokens", 24)
    if stream and dialect in ("chat", "completions"):
        body["stream_options"] = {"include_usage": True}
    return body


def post(client, h, dialect, *, stream, **extra):
    return client.simulate_post(PATHS[dialect], json=body_for(h, dialect, stream=stream, **extra))


def request_id_of(response) -> str:
    header = response.headers.get("x-request-id") or response.headers["request-id"]
    return header.removeprefix("req_")


def stream_error(dialect: str, text: str) -> dict:
    """The error a stream ended with (Chat/Completions: the error chunk before [DONE];
    Responses: response.failed; Anthropic: the error event)."""
    if dialect in ("chat", "completions"):
        chunks, done, _ = sse_chunks(text)
        assert done
        return chunks[-1]
    frames = [json.loads(block.split("data: ", 1)[1]) for block in text.strip().split("\n\n")
              if "data: " in block]
    return frames[-1]


def assert_stream_failed(dialect: str, text: str) -> None:
    event = stream_error(dialect, text)
    if dialect in ("chat", "completions"):
        assert event["error"]["code"] == "internal_error"
    elif dialect == "responses":
        assert event["type"] == "response.failed"
    else:
        assert event["type"] == "error" and event["error"]["type"] == "api_error"


def failing(*args, **kwargs):
    raise RuntimeError("injected rendering failure")


def post_failing(client, h, dialect, stream):
    """A request whose reply breaks: a 500, or a stream that opened and ends in an error."""
    response = post(client, h, dialect, stream=stream)
    if stream:
        assert response.status_code == 200
        assert_stream_failed(dialect, response.text)
    else:
        assert response.status_code == 500
    return response


@pytest.mark.parametrize("stream", [False, True], ids=["aggregate", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_render_failure_after_the_outcome_counts_once(h, client, monkeypatch, dialect,
                                                        stream):
    monkeypatch.setattr(*USAGE_BUILDERS[dialect], failing)
    before = counters(client)
    response = post_failing(client, h, dialect, stream)
    assert moved(before, counters(client)) == {"failures": 1, "stop": 1}
    lines = by_id(read_log(h), request_id_of(response))
    assert [r["event"] for r in lines] == ["request_start", "request_done"]


@pytest.mark.parametrize("stream", [False, True], ids=["aggregate", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_failure_before_the_outcome_is_a_failed_request(h, client, monkeypatch, dialect,
                                                          stream):
    """The output parser breaking on the first text (before the Finished event is read):
    one response failure, the request ends `failed`, never `cancelled` or `stop`."""
    monkeypatch.setattr(core_output.OutputParser, "push", failing)
    before = counters(client)
    response = post_failing(client, h, dialect, stream)
    monkeypatch.undo()
    assert moved(before, counters(client)) == {"failures": 1, "failed": 1}
    lines = by_id(read_log(h), request_id_of(response))
    assert [r["event"] for r in lines] == ["request_start", "request_error"]
    assert lines[1]["stage"] == "response"
    assert lines[1]["error"]["code"] == "internal_error" and lines[1]["error"]["status"] == 500


@pytest.mark.parametrize("stream", [False, True], ids=["aggregate", "stream"])
def test_a_response_the_store_cannot_keep_counts_once(h, client, monkeypatch, stream):
    def full(self, record):
        raise InvalidRequest("The response store is full.", param="store",
                             code="response_store_capacity_exceeded")

    monkeypatch.setattr(ResponseStore, "put", full)
    before = counters(client)
    response = post(client, h, "responses", stream=stream)
    if stream:
        event = stream_error("responses", response.text)
        assert event["type"] == "response.failed"
        assert event["response"]["error"]["code"] == "response_store_capacity_exceeded"
    else:
        assert response.status_code == 400
        assert response.json["error"]["code"] == "response_store_capacity_exceeded"
    assert moved(before, counters(client)) == {"failures": 1, "stop": 1}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_successes_validation_errors_and_counts_do_not_count(h, client, dialect):
    before = counters(client)
    assert post(client, h, dialect, stream=False).status_code == 200
    streamed = post(client, h, dialect, stream=True)
    assert streamed.status_code == 200 and "error" not in stream_error(dialect, streamed.text)
    assert post(client, h, dialect, stream=False, temperature="hot").status_code == 400
    assert post(client, h, dialect, stream=True, max_tokens=10 ** 6).status_code == 400
    if dialect == "anthropic":
        counted = client.simulate_post("/v1/messages/count_tokens", json={
            "model": h.ctx.model_id, "messages": [{"role": "user", "content": "hi"}]})
        assert counted.status_code == 200
    elif dialect == "responses":
        counted = client.simulate_post("/v1/responses/input_tokens", json={
            "model": h.ctx.model_id, "input": "hi"})
        assert counted.status_code == 200
    after = counters(client)
    assert after["failures"] == before["failures"]
    assert moved(before, after) == {"stop": 2, "rejected": 1}  # the context overflow


def test_engine_failure_is_not_a_response_failure(default_artifact, default_tokenizer):
    broken = build_harness(default_artifact, default_tokenizer, log_stats_interval_ms=0)
    broken.runner.fail_at_step = len(broken.runner.steps)
    client = testing.TestClient(broken.app)
    try:
        response = post(client, broken, "chat", stream=True)
        assert stream_error("chat", response.text)["error"]["code"] == "engine_unavailable"
        found = counters(client)
        assert found["failed"] == 1 and found["failures"] == 0
    finally:
        broken.close()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_client_that_leaves_is_cancelled_not_a_failure(h, client, dialect):
    before = counters(client)
    abandon_stream(h, PATHS[dialect], body_for(h, dialect, stream=True, script="ramble",
                                               max_tokens=300))
    observer = h.ctx.extras["observer"]
    observer.abandon_grace_s = 0.0
    try:
        deadline = time.monotonic() + 10
        while moved(before, counters(client)).get("cancelled") != 1:
            assert time.monotonic() < deadline, "the cancelled request never settled"
            observer.reap(time.monotonic())
            time.sleep(0.02)
    finally:
        observer.abandon_grace_s = 5.0
    assert moved(before, counters(client)) == {"cancelled": 1}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_internal_error_in_a_stream_is_logged_once_with_the_request_id(
        h, client, monkeypatch, caplog, dialect):
    monkeypatch.setattr(*USAGE_BUILDERS[dialect], failing)
    with caplog.at_level(logging.INFO, logger="ninfer_jax"):
        response = post(client, h, dialect, stream=True)
    request_id = request_id_of(response)
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and request_id in tracebacks[0].getMessage()
    assert "injected rendering failure" in caplog.text  # the traceback itself
    failed = [r.getMessage() for r in caplog.records
              if "response failed after its outcome" in r.getMessage()]
    assert failed == [f"request {request_id}: the response failed after its outcome: "
                      "500 internal_error"]


def test_anthropic_stream_error_event_carries_the_request_id(h, client, monkeypatch):
    monkeypatch.setattr(*USAGE_BUILDERS["anthropic"], failing)
    response = post(client, h, "anthropic", stream=True)
    event = stream_error("anthropic", response.text)
    assert event["request_id"] == response.headers["request-id"]
    assert event["request_id"].startswith("req_")
