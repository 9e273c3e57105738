"""The JSONL request log over a real app (real Engine, scripted fake model): every event type
with its documented fields, one terminal record per started request in every dialect,
rejections without a start, no text and no API key anywhere, argv redaction, the capture file
and the start-up path checks."""
import json
import os

import pytest
from falcon import testing

from harness import build_harness, by_id, read_log, wait_for
from ninfer_jax.serve.observability.request_log import SCHEMA, check_output_path, redact_argv

API_KEY = "sk-test-very-secret"
SECRET_PROMPT = "zebra quartz lantern"  # must never reach the log
SCRIPT_REPLY = "Mellifluous answer"
COMMON = ("event", "schema", "schema_version", "timestamp_unix_ms", "server_instance_id")


@pytest.fixture(scope="module")
def logged(default_artifact, default_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("request-log")
    h = build_harness(default_artifact, default_tokenizer,
                      request_log_jsonl=str(folder / "requests.jsonl"),
                      capture_requests=str(folder / "capture.jsonl"), log_stats_interval_ms=100,
                      argv=("ninfer", "serve", "--api-key", API_KEY, f"--api-key={API_KEY}"))
    h.book.add("reply", SCRIPT_REPLY)
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(logged):
    return testing.TestClient(logged.app)


def chat(client, model, content=f"{SECRET_PROMPT} SCRIPT:reply", **fields):
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "temperature": 0, **fields}
    return client.simulate_post("/v1/chat/completions", json=body)


def test_every_line_has_the_common_fields_and_server_start_first(logged, client):
    chat(client, logged.ctx.model_id)
    lines = read_log(logged)
    assert lines[0]["event"] == "server_start"
    for line in lines:
        assert all(key in line for key in COMMON), line["event"]
        assert line["schema"] == SCHEMA and line["schema_version"] == 1
        assert line["server_instance_id"] == lines[0]["server_instance_id"]
    start = lines[0]
    assert start["argv"] == ["ninfer", "serve", "--api-key", "<redacted>",
                             "--api-key=<redacted>"]
    assert start["artifact"]["public_model_id"] == logged.ctx.model_id
    assert start["engine"]["kv_capacity_pages"] == logged.engine.stats().kv_pages_capacity
    assert "non_thinking_defaults" in start["sampling"]


def test_chat_start_and_done_fields(logged, client, default_tokenizer):
    response = chat(client, logged.ctx.model_id, max_tokens=40)
    assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    lines = read_log(logged)
    (start,) = by_id(lines, request_id, "request_start")
    (done,) = by_id(lines, request_id, "request_done")
    assert start["protocol"] == "chat" and start["endpoint"] == "/v1/chat/completions"
    assert start["stream"] is False and start["max_tokens"] == 40
    assert start["sampling"]["greedy"] and start["sampling"]["temperature"] == 0
    assert start["sampling"]["seed_source"] == "random"
    assert start["request_seq"] == done["request_seq"]
    expected = default_tokenizer.encode(SCRIPT_REPLY, special=True)
    expected.append(default_tokenizer.eos_ids[0])
    assert done["result"]["generated_token_ids"] == expected
    assert done["finish_reason"] == "stop" and done["engine_finish_reason"] == "stop"
    usage = response.json["usage"]
    assert done["tokens"]["prompt"] == usage["prompt_tokens"] == start["prompt_tokens"]
    assert done["tokens"]["completion"] == usage["completion_tokens"] == len(expected)
    assert done["result"]["tool_call_parse"] == {
        "marker_seen": False, "num_calls": 0, "omitted_empty_arguments": 0,
        "schema_mismatched_arguments": 0, "fallback_reason": "none"}
    timings = done["timings_seconds"]
    assert set(timings) >= {"prepare", "ttft", "vision", "prefill", "decode", "total",
                            "queue", "speculative"}
    assert 0 <= timings["prepare"] <= timings["ttft"] <= timings["total"]
    assert done["generation"]["scheduling"]["preemptions"] == 0
    assert done["prefix_reuse_path"] in ("none", "prefix")


def test_stop_token_ids_are_counted_in_the_shape_and_end_the_reply(logged, client,
                                                                   default_tokenizer):
    script = default_tokenizer.encode(SCRIPT_REPLY, special=True)
    response = chat(client, logged.ctx.model_id, stop_token_ids=[script[1], 0])
    lines = read_log(logged)
    request_id = response.headers["x-request-id"]
    (start,) = by_id(lines, request_id, "request_start")
    (done,) = by_id(lines, request_id, "request_done")
    assert start["shape"]["num_stop_token_ids"] == 2 and start["shape"]["num_stop_strings"] == 0
    assert done["result"]["generated_token_ids"] == script[:2]
    assert done["finish_reason"] == done["engine_finish_reason"] == "stop"


def test_each_dialect_starts_once_and_ends_once(logged, client):
    model = logged.ctx.model_id
    prompt = f"{SECRET_PROMPT} SCRIPT:reply"
    calls = {
        "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                          "stream": True}, "x-request-id"),
        "completions": ("/v1/completions", {"prompt": prompt, "max_tokens": 8},
                        "x-request-id"),
        "responses": ("/v1/responses", {"input": prompt, "stream": True}, "x-request-id"),
        "anthropic": ("/v1/messages", {"messages": [{"role": "user", "content": prompt}],
                                       "max_tokens": 16}, "request-id"),
    }
    for protocol, (path, body, header) in calls.items():
        response = client.simulate_post(path, json={"model": model, **body})
        assert response.status_code == 200, response.text
        request_id = response.headers[header].removeprefix("req_")
        lines = read_log(logged)
        starts = by_id(lines, request_id, "request_start")
        terminals = [r for r in by_id(lines, request_id)
                     if r["event"] in ("request_done", "request_error")]
        assert len(starts) == 1 and len(terminals) == 1, protocol
        assert starts[0]["protocol"] == protocol
        assert starts[0]["stream"] is bool(body.get("stream"))
        assert terminals[0]["event"] == "request_done"


def test_rejection_logs_request_rejected_and_no_start(logged, client):
    response = chat(client, logged.ctx.model_id, max_tokens=100000)
    assert response.status_code == 400
    request_id = response.headers["x-request-id"]
    lines = read_log(logged)
    assert by_id(lines, request_id, "request_start") == []
    (rejected,) = by_id(lines, request_id, "request_rejected")
    assert rejected["phase"] == "prepare"
    assert rejected["error"] == {
        "status": 400, "type": "invalid_request_error", "code": "context_length_exceeded",
        "param": "max_tokens", "message": response.json["error"]["message"]}
    assert rejected["shape"]["protocol"] == "chat" and rejected["shape"]["num_messages"] == 1


def test_validation_failures_before_preparation_are_not_logged(logged, client):
    before = len(read_log(logged))
    response = chat(client, logged.ctx.model_id, temperature="hot")
    assert response.status_code == 400
    lines = read_log(logged)[before:]
    assert not [r for r in lines if r["event"].startswith("request_")
                and r["event"] != "request_scheduling"]


def test_throughput_records(logged, client):
    chat(client, logged.ctx.model_id, max_tokens=30, ignore_eos=True)
    assert wait_for(lambda: any(r["event"] == "throughput" for r in read_log(logged)))
    record = next(r for r in read_log(logged) if r["event"] == "throughput")
    assert set(record["tokens"]) == {"prompt", "cached", "prefill", "decode", "generation",
                                     "replayed"}
    assert record["interval_seconds"] > 0
    assert set(record["gauges"]) >= {"running", "prefilling", "decode_ready", "waiting",
                                     "paused", "replaying", "materializing"}
    assert "average_size" in record["decode"] and "step_seconds" in record["host_work"]


def test_capture_joins_the_request_log(logged, client):
    response = client.simulate_post("/v1/messages", json={
        "model": logged.ctx.model_id, "max_tokens": 8,
        "messages": [{"role": "user", "content": "SCRIPT:reply"}]})
    request_id = response.headers["request-id"].removeprefix("req_")
    capture = logged.ctx.extras["capture"]
    assert capture.flush()
    with open(capture.path, encoding="utf-8") as handle:
        captured = [json.loads(line) for line in handle]
    (line,) = [c for c in captured if c["request_id"] == request_id]
    assert line["endpoint"] == "/v1/messages" and line["body"]["max_tokens"] == 8
    assert line["event"] == "request_capture" and line["schema"] == "ninfer_request_capture"
    assert by_id(read_log(logged), request_id, "request_done")


def test_no_text_and_no_key_in_the_log(logged, client):
    chat(client, logged.ctx.model_id)
    text = open(logged.ctx.config.request_log_jsonl, encoding="utf-8").read()
    assert SECRET_PROMPT not in text and "zebra" not in text
    assert SCRIPT_REPLY not in text and "Mellifluous" not in text
    assert API_KEY not in text


def test_redact_argv_forms():
    assert redact_argv(["serve", "--api-key", "k", "--port", "1"]) == [
        "serve", "--api-key", "<redacted>", "--port", "1"]
    assert redact_argv(["--api-key=k"]) == ["--api-key=<redacted>"]


def test_output_path_checks(tmp_path, default_artifact):
    artifact = str(default_artifact.path)
    check_output_path(str(tmp_path / "ok.jsonl"), artifact, "--request-log-jsonl")
    with pytest.raises(ValueError, match="does not exist"):
        check_output_path(str(tmp_path / "missing" / "x.jsonl"), artifact, "--x")
    with pytest.raises(ValueError, match="model artifact"):
        check_output_path(artifact, artifact, "--x")
    with pytest.raises(ValueError, match="model artifact"):
        check_output_path(os.path.join(artifact, "metadata.json"), artifact, "--x")
    with pytest.raises(ValueError, match="directory"):
        check_output_path(str(tmp_path), artifact, "--x")
    if os.geteuid() != 0:  # root opens anything
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="cannot open"):
            check_output_path(str(locked / "x.jsonl"), artifact, "--x")


def test_throughput_record_skips_idle_intervals_and_reads_plainly():
    from ninfer_jax.engine.stats import EngineCounters, build_stats
    from ninfer_jax.serve.observability.throughput import pretty, throughput_record

    gauges = {"running": 0, "waiting": 0, "paused": 0, "prefilling": 0, "decode_ready": 0,
              "replaying": 0, "kv_pages_used": 0, "kv_pages_capacity": 10, "kv_pages_cached": 0,
              "page_size": 16, "max_concurrency": 2}
    counters = EngineCounters()
    idle = build_stats(counters, gauges=gauges, ready=True, healthy=True)
    assert throughput_record(idle, idle, 1.0) is None
    counters.prefill_tokens, counters.decode_tokens = 40, 12
    counters.record_decode(2, 0.5)
    counters.record_decode(1, 0.25)
    busy = build_stats(counters, gauges={**gauges, "running": 1, "decode_ready": 1},
                       ready=True, healthy=True)
    record = throughput_record(idle, busy, 2.0)
    assert record["tokens"]["prefill"] == 40 and record["tokens"]["decode"] == 12
    assert record["decode"] == {"rounds": 2, "row_rounds": 3, "average_size": 1.5}
    assert record["host_work"]["busy_fraction"] == pytest.approx(0.375)
    line = pretty(record)
    assert line.startswith("throughput 2.0s: prefill 40 tok (20.0/s), decode 12 tok (6.0/s)")
    assert "batch 1.50" in line and "\x1b" not in line
    # Still running but no progress this interval: reported, not idle.
    assert throughput_record(busy, busy, 1.0) is not None


def test_throughput_record_reports_speculative_acceptance():
    from ninfer_jax.engine.stats import EngineCounters, build_stats
    from ninfer_jax.serve.observability.throughput import pretty, throughput_record

    gauges = {"running": 1, "waiting": 0, "paused": 0, "prefilling": 0, "decode_ready": 1,
              "replaying": 0, "kv_pages_used": 0, "kv_pages_capacity": 10, "kv_pages_cached": 0,
              "page_size": 16, "max_concurrency": 1}
    counters = EngineCounters()
    before = build_stats(counters, gauges=gauges, ready=True, healthy=True)
    assert "spec" not in pretty(throughput_record(before, before, 1.0))
    counters.spec_rounds, counters.spec_draft_tokens = 10, 40
    counters.spec_accepted_tokens, counters.spec_fallback_steps = 30, 2
    after = build_stats(counters, gauges=gauges, ready=True, healthy=True)
    record = throughput_record(before, after, 1.0)
    assert record["speculative"] == {"rounds": 10, "draft_tokens": 40, "accepted_tokens": 30,
                                     "fallback_steps": 2, "acceptance": 0.75}
    assert "spec accepted 30/40 (75%, 3.00/round)" in pretty(record)
