"""The replay loop: read the capture, send every request (N at a time, in capture order),
collect the replayed requests' records from the server's request log, compare, report.

Target: a running server (`url`; its request log, if readable here, is `server_log`) or an
in-process server on an artifact (`artifact`; it writes a request log of its own, kept at
`server_log` when given, else in a temporary directory). Without a readable server log,
generated token ids are unknown and `compare_log` cannot be used.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import tempfile
import time

import httpx

from ninfer_jax.replay.compare import compare_all
from ninfer_jax.replay.records import ReplayInputError, load_captures, load_log
from ninfer_jax.replay.report import build_report
from ninfer_jax.replay.sender import send

LOG_WAIT_S = 10.0  # the server writes its log on a background thread


@dataclasses.dataclass
class ReplayOptions:
    capture_file: str
    url: str | None = None
    artifact: str | None = None
    compare_log: str | None = None
    server_log: str | None = None
    concurrency: int = 1
    api_key: str | None = None
    serve_args: tuple[str, ...] = ()
    timeout_s: float = 600.0


def send_all(base_url: str, captures, options: ReplayOptions) -> tuple[list, float]:
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    with httpx.Client(base_url=base_url, headers=headers, timeout=options.timeout_s) as client:
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=options.concurrency) as pool:
            sent = list(pool.map(lambda capture: send(client, capture), captures))
        return sent, time.perf_counter() - started


def collect(server_log: str, sent) -> dict:
    """The server's records of the replayed requests, waiting for late terminal lines."""
    wanted = {s.request_id for s in sent if s.request_id}
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        index = load_log(server_log) if os.path.exists(server_log) else {}
        pending = [i for i in wanted if i not in index or not index[i].is_settled]
        if not pending or time.monotonic() > deadline:
            return index
        time.sleep(0.1)


def run_replay(options: ReplayOptions) -> dict:
    if (options.url is None) == (options.artifact is None):
        raise ReplayInputError("give exactly one of --url and --artifact")
    if options.compare_log and options.url and not options.server_log:
        raise ReplayInputError("--compare against a --url server needs --server-log (the "
                               "server's --request-log-jsonl) to read the replayed token ids")
    captures = load_captures(options.capture_file)
    previous = load_log(options.compare_log) if options.compare_log else None
    if options.url is not None:
        sent, wall = send_all(options.url, captures, options)
        return _finish(options, options.url, sent, wall, options.server_log, previous)
    return _run_local(options, captures, previous)


def _run_local(options: ReplayOptions, captures, previous) -> dict:
    from ninfer_jax.replay.local_server import LocalServer

    with tempfile.TemporaryDirectory(prefix="ninfer-replay-") as folder:
        server_log = options.server_log or os.path.join(folder, "requests.jsonl")
        with LocalServer(options.artifact, list(options.serve_args), server_log) as server:
            base_url = server.start()
            sent, wall = send_all(base_url, captures, options)
            server.ctx.extras["request_log"].flush()
        return _finish(options, f"artifact {options.artifact}", sent, wall, server_log,
                       previous)


def _finish(options, target, sent, wall, server_log, previous) -> dict:
    replayed = collect(server_log, sent) if server_log else None
    verdicts = compare_all(sent, previous, replayed) if previous is not None else None
    return build_report(sent, replayed, verdicts, wall, target=target,
                        concurrency=options.concurrency)
