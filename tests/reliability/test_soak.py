"""A short soak in CI (tests/reliability/soak.py; `make soak` runs 2,000 requests): mixed
dialects at concurrency 16 with 20% client aborts against a real gunicorn over the fake
model: no 5xx, every request exactly one terminal log record, nothing held afterwards, worker
memory flat."""
import os
import time

import pytest

from soak import (engine_gauges, is_idle, rss_bytes, run_soak, terminal_counts,
                  worker_pid)


REQUESTS = int(os.environ.get("NINFER_SOAK_REQUESTS", "150"))


@pytest.fixture(scope="module")
def server(fake_server, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("soak") / "requests.jsonl"
    server = fake_server(decode_sleep=0.002, request_log_jsonl=str(log_path),
                         response_store_max_records=0,
                         scripts={"ramble": "la", "ok": "fine"})
    server.log_path_jsonl = log_path
    return server


def wait_until(predicate, timeout=30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_short_soak_is_clean(server):
    run_soak(server.url, requests=80, seed=1)  # warm-up: caches, lazy imports, the fake's deques
    assert wait_until(lambda: is_idle(server.url))
    pid = worker_pid(server.process.pid)
    before = rss_bytes(pid)
    report = run_soak(server.url, requests=REQUESTS, seed=2)
    print(f"soak: {report.requests} requests ({report.aborted} aborted) in "
          f"{report.elapsed_s:.1f} s, statuses {report.statuses}, worker RSS "
          f"{before / 2**20:.0f} -> {rss_bytes(pid) / 2**20:.0f} MiB")
    assert report.requests == REQUESTS and report.aborted > REQUESTS // 10
    assert report.num_5xx == 0, report.statuses
    assert set(report.statuses) <= {200}, report.statuses
    # Aborted streams end in the engine a moment later; then nothing may stay held.
    assert wait_until(lambda: is_idle(server.url)), engine_gauges(server.url)

    def every_request_logged_once():
        counts = terminal_counts(server.log_path_jsonl)
        return all(counts.get(request_id) == 1 for request_id in report.request_ids)

    assert wait_until(every_request_logged_once)
    assert rss_bytes(pid) < before * 1.10
