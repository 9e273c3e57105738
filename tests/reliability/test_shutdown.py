"""Graceful stop (serve/wire/http_worker.py, serve/wire/shutdown.py): SIGTERM and SIGINT refuse new
clients at once, let in-flight requests finish for --shutdown-timeout, end the rest with an
error event, write every request's end record, and exit 0."""
import json
import signal
import socket
import threading
import time

import httpx
import pytest

MODEL = "smollm2-135m-instruct"
TERMINAL = ("request_done", "request_error", "request_rejected")


def stream_chat(server, key, max_tokens, out: list, opened: threading.Event):
    body = {"model": MODEL, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"SCRIPT:{key}"}]}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      timeout=60) as reply:
        lines = []
        for line in reply.iter_lines():
            if line.startswith("data: "):
                opened.set()
                lines.append(line[6:])
        out.append((reply.status_code, reply.headers["x-request-id"], lines))


def start_streams(server, key, count, max_tokens):
    results, threads = [], []
    for _ in range(count):
        opened = threading.Event()
        thread = threading.Thread(target=stream_chat,
                                  args=(server, key, max_tokens, results, opened))
        thread.start()
        assert opened.wait(20)
        threads.append(thread)
    return results, threads


def terminal_records(log_path) -> dict:
    records = [json.loads(line) for line in open(log_path, encoding="utf-8")]
    ends = {}
    for record in records:
        if record.get("event") in TERMINAL:
            ends.setdefault(record["request_id"], []).append(record["event"])
    return ends


def refused(port) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_ends_long_streams_with_an_error_and_logs_every_end(fake_server, tmp_path, sig):
    log_path = tmp_path / f"requests-{sig.name}.jsonl"
    server = fake_server(decode_sleep=0.05, shutdown_timeout_s=1,
                         request_log_jsonl=str(log_path), scripts={"ramble": "la"})
    results, threads = start_streams(server, "ramble", 3, max_tokens=400)  # ~20 s each
    server.process.send_signal(sig)
    time.sleep(0.3)
    assert refused(server.port)
    assert server.process.wait(20) == 0
    for thread in threads:
        thread.join(10)
    assert len(results) == 3
    for status, request_id, lines in results:
        assert status == 200 and lines[-1] == "[DONE]"
        error = json.loads(lines[-2])["error"]
        assert error["code"] == "server_shutting_down"
    ends = terminal_records(log_path)
    assert sorted(len(ends.get(request_id, [])) for _, request_id, _ in results) == [1, 1, 1]


def test_requests_that_finish_in_time_are_not_cut(fake_server, tmp_path):
    log_path = tmp_path / "requests.jsonl"
    server = fake_server(decode_sleep=0.02, shutdown_timeout_s=10,
                         request_log_jsonl=str(log_path), scripts={"ramble": "la"})
    results, threads = start_streams(server, "ramble", 2, max_tokens=60)  # ~1.2 s each
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(20) == 0
    assert time.monotonic() - started < 8
    for thread in threads:
        thread.join(10)
    for status, request_id, lines in results:
        assert lines[-1] == "[DONE]"
        assert json.loads(lines[-2])["choices"][0]["finish_reason"] == "length"
    ends = terminal_records(log_path)
    assert all(ends[request_id] == ["request_done"] for _, request_id, _ in results)
