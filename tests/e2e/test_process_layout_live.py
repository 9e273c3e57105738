"""The process layout of a live `ninfer serve`: one engine-core process that alone has JAX
loaded, gunicorn HTTP workers that never load it, several workers sharing one core
(--http-workers 2: /metrics summed over workers), the core's death seen by every worker,
and a shutdown that leaves no process behind.

Whether a process has JAX is read from /proc/<pid>/maps: JAX's native library (jaxlib) is
mapped into a process exactly when it imported jax."""
import concurrent.futures
import os
import pathlib
import signal
import subprocess
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import BASE_FLAGS, FEW_SHAPES, NINFER

pytestmark = pytest.mark.skipif(not pathlib.Path("/proc/self/maps").exists(),
                                reason="reads /proc")
MODEL = "smollm2-135m-instruct"
TWO_WORKERS = (*BASE_FLAGS, *FEW_SHAPES, "--http-workers", "2", "--response-store-max-records", "0")
PENDING_THREE = (*BASE_FLAGS, *FEW_SHAPES, "--max-pending-requests", "3")
EARLY_SERVERS = {"two_workers": lambda: (TWO_WORKERS, None),
                 "pending_three": lambda: (PENDING_THREE, None)}


@pytest.fixture
def two_workers(server_factory):
    return server_factory(*TWO_WORKERS)


@pytest.fixture
def pending_three(server_factory):
    return server_factory(*PENDING_THREE)


def children(pid: int) -> dict[int, str]:
    """pid -> command line of the direct children of `pid`."""
    found = {}
    for entry in pathlib.Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ValueError, IndexError):
            continue
    return {child: cmd.decode(errors="replace") for child, cmd in found.items()}


def has_jax(pid: int) -> bool:
    return "jaxlib" in pathlib.Path(f"/proc/{pid}/maps").read_text()


def roles(server) -> tuple[int, list[int]]:
    """(engine-core pid, HTTP worker pids) of a live server."""
    kids = children(server.process.pid)
    cores = [pid for pid, cmd in kids.items() if "multiprocessing.spawn" in cmd]
    workers = [pid for pid, cmd in kids.items() if " serve " in cmd]
    assert len(cores) == 1, kids
    return cores[0], workers


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def chat(server, text: str) -> httpx.Response:
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=300) as client:
        return client.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": text}]})


def requests_total(server) -> dict[str, float]:
    response = httpx.get(server.url + "/metrics", headers=server.headers)
    assert response.status_code == 200
    for family in text_string_to_metric_families(response.text):
        if family.name == "ninfer_requests":
            return {s.labels["outcome"]: s.value for s in family.samples
                    if s.name == "ninfer_requests_total"}
    raise AssertionError("no ninfer_requests_total")


def test_only_the_engine_core_loads_jax(live_server):
    core, workers = roles(live_server)
    assert has_jax(core)
    assert len(workers) == 1 and not has_jax(workers[0])
    # The worker still reports what JAX runs on: the core told it.
    metrics = httpx.get(live_server.url + "/metrics", headers=live_server.headers).text
    info = [line for line in metrics.splitlines() if line.startswith("ninfer_model_info{")]
    assert len(info) == 1 and 'backend="cpu"' in info[0]


def test_health_answers_while_the_core_reads_the_weights(two_workers):
    """Each worker answers /health ("loading") as soon as it runs, before the engine core
    has read the weights and built its engine (logged as "... warming up"): a worker used to
    accept no connection until then (an 8B restart: 18 s with no answer)."""
    import datetime

    line = next(line for line in two_workers.stderr_text().splitlines()
                if line.endswith("warming up"))
    built = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").timestamp()
    assert two_workers.first_health_at is not None
    assert two_workers.first_health_at < built, (two_workers.first_health_at, line)


def test_two_http_workers_share_one_core_until_it_dies(two_workers):
    server = two_workers
    core, workers = roles(server)
    assert len(workers) == 2 and has_jax(core) and not any(has_jax(w) for w in workers)
    before = requests_total(server).get("length", 0.0)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: chat(server, f"Count to {i}."), range(8)))
    assert [r.status_code for r in replies] == [200] * 8
    # Each scrape lands on either worker; each must count both workers' requests.
    for _ in range(6):
        assert requests_total(server)["length"] == before + 8

    os.kill(core, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while httpx.get(server.url + "/health").status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    for _ in range(4):  # whichever worker answers
        assert httpx.get(server.url + "/health").json()["status"] == "unavailable"
        reply = chat(server, "Hello")
        assert reply.status_code == 503
        assert reply.json()["error"]["code"] == "engine_unavailable"

    server.stop()
    assert server.process.returncode == 0
    assert not any(alive(pid) for pid in workers)


def test_sigterm_stops_workers_and_core(pending_three):
    server = pending_three
    core, workers = roles(server)
    assert chat(server, "Hi").status_code == 200
    server.stop()
    assert server.process.returncode == 0
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in (core, *workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in (core, *workers))
    assert "stopping the engine core" in server.stderr_text()


def test_several_workers_refuse_the_per_worker_responses_store():
    result = subprocess.run([str(NINFER), "serve", "--http-workers", "2"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert "--response-store-max-records 0" in result.stderr
