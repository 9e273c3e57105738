"""A bounded soak of a running server: mixed dialects at a fixed concurrency, a share of
client aborts mid-stream, then the books: no 5xx, one terminal request-log record per
request, no lane, KV page or host-tier slot left held, worker memory flat.

`run_soak(url, ...)` drives the load and returns a `SoakReport`; tests/reliability/
test_soak.py runs a short one in CI (300 requests) and `make soak` a long one
(NINFER_SOAK_REQUESTS=2000)."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import random
import re
import threading
import time

import httpx

MODEL = "smollm2-135m-instruct"
TERMINAL = ("request_done", "request_error", "request_rejected")


@dataclasses.dataclass
class SoakReport:
    requests: int = 0
    aborted: int = 0
    statuses: dict = dataclasses.field(default_factory=dict)
    request_ids: list = dataclasses.field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def num_5xx(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)


def _body(kind: str, rng: random.Random, stream: bool) -> tuple[str, dict]:
    script = rng.choice(["SCRIPT:ramble", "SCRIPT:ok", "hello there"])
    tokens = rng.randint(2, 40)
    if kind == "chat":
        return "/v1/chat/completions", {"model": MODEL, "max_tokens": tokens, "stream": stream,
                                        "messages": [{"role": "user", "content": script}]}
    if kind == "completions":
        return "/v1/completions", {"model": MODEL, "max_tokens": tokens, "stream": stream,
                                   "prompt": script}
    if kind == "responses":
        return "/v1/responses", {"model": MODEL, "max_output_tokens": tokens, "stream": stream,
                                 "input": script, "store": False}
    return "/v1/messages", {"model": MODEL, "max_tokens": tokens, "stream": stream,
                            "messages": [{"role": "user", "content": script}]}


def _one(client: httpx.Client, rng: random.Random, abort_share: float):
    kind = rng.choice(["chat", "completions", "responses", "messages"])
    abort = rng.random() < abort_share
    path, body = _body(kind, rng, stream=abort or rng.random() < 0.5)
    with client.stream("POST", path, json=body) as reply:
        request_id = reply.headers.get("x-request-id") or reply.headers.get("request-id", "")
        if abort and reply.status_code == 200:
            next(reply.iter_bytes(), None)  # the stream is open: leave mid-way
            return reply.status_code, request_id.removeprefix("req_"), True
        reply.read()
        if reply.status_code == 200 and b'"internal_error"' in reply.content:
            return 500, request_id.removeprefix("req_"), False
        return reply.status_code, request_id.removeprefix("req_"), False


def run_soak(url: str, *, requests: int, concurrency: int = 16, abort_share: float = 0.2,
             seed: int = 0) -> SoakReport:
    report = SoakReport()
    lock = threading.Lock()
    rngs = [random.Random(seed * 1000 + n) for n in range(concurrency)]
    counter = iter(range(requests))

    def worker(rng):
        with httpx.Client(base_url=url, timeout=120) as client:
            while True:
                with lock:
                    if next(counter, None) is None:
                        return
                status, request_id, aborted = _one(client, rng, abort_share)
                with lock:
                    report.requests += 1
                    report.aborted += aborted
                    report.statuses[status] = report.statuses.get(status, 0) + 1
                    report.request_ids.append(request_id)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(worker, rng) for rng in rngs]:
            future.result()
    report.elapsed_s = time.monotonic() - started
    return report


def terminal_counts(log_path) -> dict[str, int]:
    counts: dict[str, int] = {}
    with open(log_path, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if record.get("event") in TERMINAL:
                counts[record["request_id"]] = counts.get(record["request_id"], 0) + 1
    return counts


def engine_gauges(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {name: float(value) for name, value in
            re.findall(r"^(ninfer_\w+) ([0-9.e+-]+)$", text, re.MULTILINE)}


def is_idle(url: str) -> bool:
    """Nothing running, waiting or paused, and no KV page or host-tier slot held beyond what
    the prefix cache keeps (device pages, spilled host pages and hybrid checkpoint rows)."""
    gauges = engine_gauges(url)
    return (gauges.get("ninfer_requests_running", 0) == 0
            and gauges.get("ninfer_requests_waiting", 0) == 0
            and gauges.get("ninfer_requests_paused", 0) == 0
            and gauges.get("ninfer_device_kv_used_pages", 0)
            == gauges.get("ninfer_device_kv_cached_pages", 0)
            and gauges.get("ninfer_host_context_used_bytes", 0)
            == gauges.get("ninfer_host_context_cached_bytes", 0)
            + gauges.get("ninfer_host_context_checkpoint_bytes", 0))


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def worker_pid(server_pid: int) -> int:
    with open(f"/proc/{server_pid}/task/{server_pid}/children", encoding="ascii") as handle:
        return int(handle.read().split()[0])
