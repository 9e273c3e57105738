"""Observability end to end on a live `ninfer serve` of the default model, with
--request-log-jsonl, --capture-requests and a short --log-stats-interval-ms: /metrics through
real requests (behind the API key), the request log through the openai and anthropic SDKs,
stderr records, no prompt text and no key anywhere, start-up failures on unusable log paths,
and the capture -> `ninfer replay` -> compare loop (greedy requests identical, a changed
sampling setting reported as a mismatch).

Every request here is greedy and they run one at a time, so a replay must reproduce each
one's token ids exactly."""
import json
import os
import re
import shutil
import subprocess
import time

import anthropic
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import API_KEY, BASE_FLAGS, FEW_SHAPES, NINFER, early_folder, free_port, log_records

MODEL = "smollm2-135m-instruct"
SECRET_PROMPT = "Describe the violet heron of Quillmere in two words."
STDERR_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} [A-Z]+ ")


def obs_flags() -> tuple:
    folder = early_folder("observability")
    return (*BASE_FLAGS, *FEW_SHAPES, "--request-log-jsonl", str(folder / "requests.jsonl"),
            "--capture-requests", str(folder / "capture.jsonl"), "--log-stats-interval-ms", "500")


EARLY_SERVERS = {"obs": lambda: (obs_flags(), API_KEY)}


@pytest.fixture(scope="module")
def obs(server_factory):
    server = server_factory(*obs_flags(), api_key=API_KEY)
    server.folder = early_folder("observability")
    return server


def log_lines(server) -> list[dict]:
    text = (server.folder / "requests.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def records(server, request_id, event, wait_s=10.0):
    """This request's `event` lines (conftest.log_records)."""
    return log_records(server.folder / "requests.jsonl", request_id, event, wait_s)


def scrape(server) -> dict:
    response = httpx.get(server.url + "/metrics", headers=server.headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples}


def chat(server, content=SECRET_PROMPT, **fields):
    return server.openai().with_raw_response.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], temperature=0,
        max_tokens=24, **fields)


def test_metrics_move_with_requests(obs):
    assert httpx.get(obs.url + "/metrics").status_code == 401
    before = scrape(obs)
    plain = chat(obs).parse()
    streamed = list(chat(obs, stream=True, stream_options={"include_usage": True}).parse())
    after = scrape(obs)
    completion = plain.usage.completion_tokens + streamed[-1].usage.completion_tokens

    def grew(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before[key]

    assert grew("ninfer_generation_tokens_total") == completion
    assert grew("ninfer_prompt_tokens_total") == 2 * plain.usage.prompt_tokens
    finished = grew("ninfer_requests_total", outcome="stop") + grew(
        "ninfer_requests_total", outcome="length")
    assert finished == 2
    for histogram in ("ninfer_time_to_first_token_seconds", "ninfer_request_duration_seconds",
                      "ninfer_request_queue_seconds"):
        assert grew(f"{histogram}_count") == 2
    assert after[("ninfer_engine_ready", ())] == 1
    # No --kv-capacity: a full 1024-token context for each of the 4 lanes.
    assert after[("ninfer_device_kv_capacity_pages", ())] == 4 * 1024 // 16
    for gauge in ("running", "waiting", "paused", "prefilling", "decode_ready"):
        assert after[(f"ninfer_requests_{gauge}", ())] == 0


def test_request_log_covers_every_dialect(obs):
    lines = log_lines(obs)
    start = lines[0]
    assert start["event"] == "server_start" and "<redacted>" in start["argv"]
    response = chat(obs)
    request_id = response.headers["x-request-id"]
    usage = response.parse().usage
    responses = obs.openai().with_raw_response.responses.create(
        model=MODEL, input=SECRET_PROMPT, temperature=0, max_output_tokens=16)
    messages = anthropic.Anthropic(base_url=obs.url, api_key=API_KEY, max_retries=0) \
        .messages.with_raw_response.create(
            model=MODEL, max_tokens=16, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": SECRET_PROMPT}])
    ids = {"chat": request_id, "responses": responses.headers["x-request-id"],
           "anthropic": messages.headers["request-id"].removeprefix("req_")}
    for protocol, rid in ids.items():
        (begin,) = records(obs, rid, "request_start")
        (done,) = records(obs, rid, "request_done")
        assert begin["protocol"] == protocol and begin["sampling"]["greedy"]
        assert done["server_instance_id"] == start["server_instance_id"]
        assert len(done["result"]["generated_token_ids"]) == done["tokens"]["completion"]
        assert done["timings_seconds"]["ttft"] <= done["timings_seconds"]["total"]
    (done,) = records(obs, request_id, "request_done")
    assert done["tokens"]["completion"] == usage.completion_tokens
    assert done["tokens"]["prompt"] == usage.prompt_tokens


def test_rejected_request_has_no_start(obs):
    response = httpx.post(obs.url + "/v1/chat/completions", headers=obs.headers, json={
        "model": MODEL, "max_tokens": 5000, "temperature": 0,
        "messages": [{"role": "user", "content": SECRET_PROMPT}]})
    assert response.status_code == 400
    request_id = response.headers["x-request-id"]
    (rejected,) = records(obs, request_id, "request_rejected")
    assert rejected["error"]["code"] == "context_length_exceeded"
    assert records(obs, request_id, "request_start", wait_s=0) == []


def test_throughput_and_stderr_records(obs):
    chat(obs)
    deadline = time.monotonic() + 10
    while not any(r["event"] == "throughput" for r in log_lines(obs)):
        assert time.monotonic() < deadline, "no throughput record"
        time.sleep(0.2)
    stderr = obs.stderr_text()
    assert "\x1b" not in stderr  # redirected: no terminal control sequences
    ours = [line for line in stderr.splitlines() if " request " in line or "throughput" in line]
    assert any(" INFO throughput " in line for line in ours)
    assert any(re.search(r" INFO request \w+ done ", line) for line in ours)
    for line in ours:
        assert STDERR_LINE.match(line), line


def test_no_prompt_text_and_no_key_anywhere(obs):
    reply = chat(obs).parse().choices[0].message.content
    texts = {"request log": (obs.folder / "requests.jsonl").read_text(),
             "stderr": obs.stderr_text(),
             "metrics": httpx.get(obs.url + "/metrics", headers=obs.headers).text}
    for name, text in texts.items():
        assert "Quillmere" not in text and "violet heron" not in text, name
        assert API_KEY not in text, name
        if len(reply) >= 12:
            assert reply not in text, name
    # The capture file is the one place that holds bodies (opt-in), and still no key.
    capture = (obs.folder / "capture.jsonl").read_text()
    assert "Quillmere" in capture and API_KEY not in capture


@pytest.mark.parametrize("option", ["--request-log-jsonl", "--capture-requests"])
def test_unusable_log_paths_stop_startup(option, default_artifact_path, tmp_path):
    for path, reason in ((tmp_path / "missing" / "x.jsonl", "does not exist"),
                         (default_artifact_path / "metadata.json", "model artifact")):
        result = subprocess.run(
            [str(NINFER), "serve", str(default_artifact_path), "--port", str(free_port()),
             option, str(path)], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and reason in result.stderr, result.stderr


def test_capture_replay_compare(obs, tmp_path):
    """Runs last: replays everything this module captured against the same server."""
    deadline = time.monotonic() + 10
    while True:  # the earlier tests' last terminal lines may still be on their way to disk
        lines = log_lines(obs)
        started = {r["request_id"] for r in lines if r["event"] == "request_start"}
        ended = {r.get("request_id") for r in lines
                 if r["event"] in ("request_done", "request_error")}
        if started <= ended or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    previous = tmp_path / "previous.jsonl"
    shutil.copy(obs.folder / "requests.jsonl", previous)
    capture = tmp_path / "capture.jsonl"
    shutil.copy(obs.folder / "capture.jsonl", capture)
    env = {**os.environ, "NINFER_API_KEY": API_KEY}
    common = ["--url", obs.url, "--server-log", str(obs.folder / "requests.jsonl"),
              "--compare", str(previous), "--json"]
    result = subprocess.run([str(NINFER), "replay", str(capture), *common], env=env,
                            capture_output=True, text=True, timeout=600)
    report = json.loads(result.stdout)
    counts = report["comparison"]["counts"]
    assert result.returncode == 0, counts
    assert counts["identical"] == report["requests"] >= 8
    assert report["ttft_seconds"]["count"] >= 7 and report["latency_seconds"]["p50"] > 0

    lines = [json.loads(line) for line in capture.read_text().splitlines()]
    lines[0]["body"]["temperature"] = 1.5  # a deliberate change of a greedy request
    lines[0]["body"]["seed"] = 99
    changed = tmp_path / "changed.jsonl"
    changed.write_text(json.dumps(lines[0]) + "\n")
    result = subprocess.run([str(NINFER), "replay", str(changed), *common], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1
    (verdict,) = json.loads(result.stdout)["comparison"]["verdicts"]
    assert verdict["verdict"] == "mismatch" and "temperature" in verdict["changed_sampling"]
