"""GET /metrics over a real app (real Engine, scripted fake model): the documented names in
text format 0.0.4, counters that only grow, gauges back at zero when idle, histograms counted
once per request, requests by outcome, the API key, and readability after an engine failure."""
import threading

import pytest
from falcon import testing
from prometheus_client.parser import text_string_to_metric_families

from harness import build_harness, wait_for
from ninfer_jax.serve.observability.metrics import ENGINE_COUNTERS, ENGINE_GAUGES

API_KEY = "metrics-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def scrape(client) -> dict:
    """{(sample name, frozenset(labels)): value}."""
    response = client.simulate_get("/metrics", headers=AUTH)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples, name, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture(scope="module")
def h(default_artifact, default_tokenizer):
    harness = build_harness(default_artifact, default_tokenizer, api_key=API_KEY,
                            log_stats_interval_ms=0)
    harness.book.add("reply", "Short reply here")
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def client(h):
    return testing.TestClient(h.app)


def chat(client, model, **fields):
    body = {"model": model, "messages": [{"role": "user", "content": "SCRIPT:reply"}],
            "temperature": 0, **fields}
    return client.simulate_post("/v1/chat/completions", json=body, headers=AUTH)


def test_every_documented_name_is_exported(client):
    samples = scrape(client)
    names = {name for name, _ in samples}
    for name, _, _ in ENGINE_GAUGES + ENGINE_COUNTERS:
        assert name in names, name
    for name in ("ninfer_model_info", "ninfer_engine_ready", "ninfer_max_concurrency",
                 "ninfer_max_context_tokens", "ninfer_requests_total",
                 "ninfer_response_failures_total", "ninfer_context_transfer_bytes_total",
                 "ninfer_host_work_seconds_total", "ninfer_step_launches_total",
                 "ninfer_step_launch_seconds_total", "ninfer_step_launch_compiles_total",
                 "ninfer_step_launch_compile_seconds_total"):
        assert name in names, name
    for histogram in ("ninfer_time_to_first_token_seconds", "ninfer_request_duration_seconds",
                      "ninfer_request_queue_seconds"):
        assert {f"{histogram}_bucket", f"{histogram}_sum", f"{histogram}_count"} <= names
    assert value(samples, "ninfer_engine_ready") == 1.0
    assert value(samples, "ninfer_max_context_tokens") == 512
    assert value(samples, "ninfer_max_concurrency") == 4  # the engine's lanes (harness: 4)
    assert value(samples, "ninfer_device_kv_capacity_pages") == 129


def test_metrics_follow_the_api_key(client):
    assert client.simulate_get("/metrics").status_code == 401
    assert client.simulate_get("/metrics", headers={"x-api-key": API_KEY}).status_code == 200


def test_counters_grow_histograms_count_once_gauges_return_to_zero(h, client):
    before = scrape(client)
    responses = []
    threads = [threading.Thread(target=lambda: responses.append(chat(client, h.ctx.model_id)))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rejected = chat(client, h.ctx.model_id, max_tokens=10 ** 6)
    assert rejected.status_code == 400
    assert all(r.status_code == 200 for r in responses)
    completion = sum(r.json["usage"]["completion_tokens"] for r in responses)
    prompt = sum(r.json["usage"]["prompt_tokens"] for r in responses)
    # The engine publishes its stats snapshot at the end of a round, after the events that
    # let the replies go out, so a scrape right after them may still show the last one.
    after = {}

    def settled():
        after.update(scrape(client))
        return grew("ninfer_generation_tokens_total") >= completion and \
            value(after, "ninfer_requests_running") == 0

    def grew(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert wait_for(settled), "the engine's counters never caught up with the replies"

    assert grew("ninfer_generation_tokens_total") == completion
    assert grew("ninfer_decode_tokens_total") == completion - 3  # first tokens come from prefill
    assert grew("ninfer_prompt_tokens_total") == prompt
    assert grew("ninfer_prefill_tokens_total") + grew("ninfer_prompt_tokens_cached_total") \
        == prompt
    assert grew("ninfer_requests_total", outcome="stop") == 3
    assert grew("ninfer_requests_total", outcome="rejected") == 1
    for histogram in ("ninfer_time_to_first_token_seconds", "ninfer_request_duration_seconds",
                      "ninfer_request_queue_seconds"):
        assert grew(f"{histogram}_count") == 3, histogram
    for key, current in after.items():  # counters never go down
        if key[0].endswith(("_total", "_count", "_sum")) and key in before:
            assert current >= before[key], key
    for gauge in ("ninfer_requests_running", "ninfer_requests_waiting",
                  "ninfer_requests_paused", "ninfer_requests_prefilling",
                  "ninfer_requests_decode_ready", "ninfer_requests_replaying"):
        assert value(after, gauge) == 0, gauge
    assert value(after, "ninfer_device_kv_used_pages") == value(
        after, "ninfer_device_kv_cached_pages")  # idle: only retained prefixes hold pages


def test_gauges_show_a_running_request(default_artifact, default_tokenizer):
    slow = build_harness(default_artifact, default_tokenizer, decode_sleep=0.01,
                         log_stats_interval_ms=0)
    slow.book.add("ramble", "la", end=False)
    client = testing.TestClient(slow.app)
    thread = threading.Thread(target=lambda: client.simulate_post("/v1/chat/completions", json={
        "model": slow.ctx.model_id, "max_tokens": 150, "ignore_eos": True,
        "messages": [{"role": "user", "content": "SCRIPT:ramble"}]}))
    thread.start()
    try:
        seen = []
        for _ in range(200):
            samples = scrape(client)
            seen.append(value(samples, "ninfer_requests_running"))
            if seen[-1] == 1:
                assert value(samples, "ninfer_requests_decode_ready") <= 1
                assert value(samples, "ninfer_device_kv_used_pages") >= 1
                break
            thread.join(0.01)
        assert 1 in seen
    finally:
        thread.join()
        slow.close()
    assert value(scrape(client), "ninfer_requests_running") == 0


def test_readable_after_engine_failure(default_artifact, default_tokenizer):
    broken = build_harness(default_artifact, default_tokenizer, log_stats_interval_ms=0)
    broken.runner.fail_at_step = len(broken.runner.steps)
    client = testing.TestClient(broken.app)
    response = client.simulate_post("/v1/chat/completions", json={
        "model": broken.ctx.model_id, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 503
    samples = scrape(client)
    assert value(samples, "ninfer_engine_ready") == 0.0
    assert value(samples, "ninfer_requests_total", outcome="failed") == 1
    broken.close()


def test_every_metric_field_is_an_engine_stats_field():
    import dataclasses

    from ninfer_jax.engine.stats import EngineStats

    names = {f.name for f in dataclasses.fields(EngineStats)}
    for metric, doc, field in ENGINE_GAUGES + ENGINE_COUNTERS:
        if field is None:
            assert "not built yet" in doc, metric  # always 0, and says so
            continue
        for name in field if isinstance(field, tuple) else (field,):
            assert name in names, (metric, name)


def test_a_missing_stats_field_is_an_error_not_zero(h):
    import dataclasses

    from ninfer_jax.serve.observability.metrics import EngineCollector

    class Renamed:
        """A snapshot whose `running` field was renamed."""

        def __init__(self, stats):
            fields = dataclasses.asdict(stats)
            fields["running_requests"] = fields.pop("running")
            self.__dict__.update(fields)

    class Engine:
        healthy = True

        def stats(self):
            return Renamed(h.engine.stats())

    collector = EngineCollector(dataclasses.replace(h.ctx, engine=Engine()))
    with pytest.raises(AttributeError, match="running"):
        list(collector.collect())
