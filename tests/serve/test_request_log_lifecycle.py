"""Request-log records of the harder paths: pauses under KV pressure (request_scheduling),
queue timeouts and engine failures (request_error), overload at submission (request_rejected
with the dialect's status), a client that disconnects mid-stream (the reaper still writes the
one terminal record), and the stderr lifecycle lines."""
import logging
import threading
import time

import pytest
from falcon import testing

from harness import abandon_stream, build_harness, by_id, read_log, wait_for

TERMINALS = ("request_done", "request_error")


def assert_one_terminal_per_start(lines):
    started = {r["request_id"] for r in lines if r["event"] == "request_start"}
    for request_id in started:
        terminals = [r for r in by_id(lines, request_id) if r["event"] in TERMINALS]
        assert len(terminals) == 1, (request_id, terminals)
    rejected = {r["request_id"] for r in lines if r["event"] == "request_rejected"}
    assert not rejected & started


def make(artifact, tokenizer, folder, name, **options):
    return build_harness(artifact, tokenizer, request_log_jsonl=str(folder / f"{name}.jsonl"),
                         log_stats_interval_ms=0, **options)


def in_thread(fn):
    thread = threading.Thread(target=fn)
    thread.start()
    return thread


@pytest.mark.parametrize("host_mib, route", [(0, "replay"), (8192, "snapshot")])
def test_pauses_under_kv_pressure_write_scheduling_records(default_artifact, default_tokenizer,
                                                           tmp_path, host_mib, route):
    # A per-step sleep keeps the eight requests resident together (an instant fake model
    # would let them finish one by one and never touch the pool's limit).
    h = make(default_artifact, default_tokenizer, tmp_path, "pressure", decode_sleep=0.002,
             engine_options={"lanes": 8, "host_mib": host_mib})
    client = testing.TestClient(h.app)
    ids = []

    def run(index):
        # Distinct raw prompts (no shared prefix); 8 x 420 tokens outgrow the 129-page pool.
        response = client.simulate_post("/v1/completions", json={
            "model": h.ctx.model_id, "prompt": [100 + index] * 20, "max_tokens": 400,
            "ignore_eos": True, "temperature": 0})
        assert response.status_code == 200
        ids.append(response.headers["x-request-id"])

    for thread in [in_thread(lambda i=i: run(i)) for i in range(8)]:
        thread.join()
    h.close()
    lines = read_log(h)
    assert_one_terminal_per_start(lines)
    scheduling = [r for r in lines if r["event"] == "request_scheduling"]
    kinds = {r["kind"] for r in scheduling}
    assert {"pause_started", "paused", "restore_started", "restored", "recovery_complete",
            "terminal"} <= kinds
    assert ("replay_complete" in kinds) == (route == "replay")
    for record in scheduling:
        assert record["request_id"] in ids and record["preemption_index"] >= 1
        assert record["route"] == (None if record["kind"] in ("pause_started", "terminal")
                                   else route)
        assert set(record["progress"]) == {"global", "request"}
        assert record["elapsed_ns"] >= 0 and record["steady_ns"] > 0
    for request_id in ids:
        (done,) = by_id(lines, request_id, "request_done")
        paused = by_id(lines, request_id, "request_scheduling")
        pauses = [r for r in paused if r["kind"] == "paused"]
        counters = done["generation"]["scheduling"]
        assert counters["preemptions"] == len(pauses)
        if pauses:
            assert (counters["replayed_tokens"] > 0) == (route == "replay")
            assert paused[-1]["kind"] == "terminal"
        assert done["tokens"]["completion"] == 400


def test_queue_timeout_and_overload(default_artifact, default_tokenizer, tmp_path):
    h = make(default_artifact, default_tokenizer, tmp_path, "queue", decode_sleep=0.01,
             pending_timeout_ms=1000, engine_options={"lanes": 1, "pending": 1})
    h.book.add("ramble", "la", end=False)
    client = testing.TestClient(h.app)
    model = h.ctx.model_id
    long_body = {"model": model, "max_tokens": 200, "ignore_eos": True,
                 "messages": [{"role": "user", "content": "SCRIPT:ramble"}]}
    busy = in_thread(lambda: client.simulate_post("/v1/chat/completions", json=long_body))
    assert wait_for(lambda: h.engine.stats().running == 1)
    waiter = {}
    queued = in_thread(lambda: waiter.update(r=client.simulate_post("/v1/messages", json={
        "model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})))
    assert wait_for(lambda: h.engine.stats().waiting == 1)
    overloaded = client.simulate_post("/v1/chat/completions", json={
        "model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    queued.join()
    busy.join()
    h.close()
    assert overloaded.status_code == 429
    assert waiter["r"].status_code == 504
    lines = read_log(h)
    assert_one_terminal_per_start(lines)
    (rejected,) = by_id(lines, overloaded.headers["x-request-id"], "request_rejected")
    assert rejected["stage"] == "submit" and rejected["error"]["status"] == 429
    assert rejected["error"]["code"] == "server_overloaded"
    (error,) = by_id(lines, waiter["r"].headers["request-id"].removeprefix("req_"), "request_error")
    assert error["error"]["status"] == 504 and error["error"]["type"] == "timeout_error"
    assert error["stage"] == "queue" and error["sampling"]["seed_source"] == "random"
    assert by_id(lines, waiter["r"].headers["request-id"].removeprefix("req_"), "request_start")


def test_engine_failure_is_request_error(default_artifact, default_tokenizer, tmp_path):
    h = make(default_artifact, default_tokenizer, tmp_path, "failure")
    h.runner.fail_at_step = len(h.runner.steps)  # the next step raises
    client = testing.TestClient(h.app)
    response = client.simulate_post("/v1/chat/completions", json={
        "model": h.ctx.model_id, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 503
    lines = read_log(h)
    (error,) = by_id(lines, response.headers["x-request-id"], "request_error")
    assert error["error"]["code"] == "engine_unavailable" and error["error"]["status"] == 503
    assert_one_terminal_per_start(lines)
    h.close()


def test_abandoned_stream_still_gets_one_terminal(default_artifact, default_tokenizer,
                                                  tmp_path):
    h = make(default_artifact, default_tokenizer, tmp_path, "abandon", decode_sleep=0.01)
    h.book.add("ramble", "la", end=False)
    # The stream's release reads nothing (no wait), so the reaper's takeover is what ends it.
    h.ctx.extras["observer"].release_wait_s = 0.0
    headers = abandon_stream(h, "/v1/chat/completions", {
        "model": h.ctx.model_id, "stream": True, "max_tokens": 400,
        "messages": [{"role": "user", "content": "SCRIPT:ramble"}]})
    request_id = headers["x-request-id"]
    observer = h.ctx.extras["observer"]
    observer.abandon_grace_s = 0.0
    observer.reap(time.monotonic())  # takes the handle over (its grace ended at release)
    # ... unless the reaper's own thread claimed it first: then that thread ends it.
    assert wait_for(lambda: observer.active() == [])
    lines = read_log(h)
    (done,) = by_id(lines, request_id, "request_done")
    assert done["finish_reason"] == "cancelled"
    assert 0 < done["tokens"]["completion"] < 400
    assert done["result"]["tool_call_parse"] is not None  # replayed through the assembler
    assert_one_terminal_per_start(lines)
    h.close()


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "SCRIPT:ramble"}]}),
    ("/v1/completions", {"prompt": "SCRIPT:ramble"}),
    ("/v1/responses", {"input": "SCRIPT:ramble", "store": False}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "SCRIPT:ramble"}]})])
def test_a_released_stream_is_done_when_its_client_leaves(default_artifact, default_tokenizer,
                                                          tmp_path, path, body):
    # The reaper's grace never ends here, so only the stream's own release can write the
    # record, and it does before the close returns: the cancelled request's request_done
    # follows the disconnect by one engine round, not by the grace period (5-6 s live).
    h = make(default_artifact, default_tokenizer, tmp_path, "release", decode_sleep=0.01)
    h.book.add("ramble", "la", end=False)
    observer = h.ctx.extras["observer"]
    observer.abandon_grace_s = float("inf")
    observer.release_wait_s = 600.0
    limit = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
    headers = abandon_stream(h, path, {"model": h.ctx.model_id, "stream": True, limit: 400,
                                       **body})
    request_id = headers.get("x-request-id") or headers["request-id"].removeprefix("req_")
    (done,) = by_id(read_log(h), request_id, "request_done")
    assert done["finish_reason"] == "cancelled"
    assert 0 < done["tokens"]["completion"] < 400
    assert observer.active() == []  # nothing is left for the reaper
    h.close()


def test_stderr_lifecycle_lines_carry_no_text(default_artifact, default_tokenizer, tmp_path,
                                              caplog):
    h = make(default_artifact, default_tokenizer, tmp_path, "stderr")
    client = testing.TestClient(h.app)
    with caplog.at_level(logging.INFO, logger="ninfer_jax.serve.requests"):
        ok = client.simulate_post("/v1/chat/completions", json={
            "model": h.ctx.model_id, "max_tokens": 5,
            "messages": [{"role": "user", "content": "plover secret words"}]})
        bad = client.simulate_post("/v1/chat/completions", json={
            "model": h.ctx.model_id, "max_tokens": 99999,
            "messages": [{"role": "user", "content": "plover secret words"}]})
    h.close()
    text = "\n".join(r.getMessage() for r in caplog.records)
    request_id = ok.headers["x-request-id"]
    assert f"request {request_id} start chat" in text
    assert f"request {request_id} done" in text
    assert f"request {bad.headers['x-request-id']} rejected: 400 context_length_exceeded" in text
    assert "plover" not in text and ok.json["choices"][0]["message"]["content"] not in text


def test_null_trace_when_no_observer(default_artifact, default_tokenizer):
    """Apps built without the observability services still generate."""
    from ninfer_jax.serve.core.generation import GenerationOptions, prepare_raw, submit

    h = build_harness(default_artifact, default_tokenizer, log_stats_interval_ms=0)
    h.ctx.extras.pop("observer")
    prepared = prepare_raw(h.ctx, [1, 2, 3], GenerationOptions(max_tokens=2), "raw-1")
    handle = submit(h.ctx, prepared)
    assert [e for e in handle.events()][-1].reason == "length"
    h.close()
