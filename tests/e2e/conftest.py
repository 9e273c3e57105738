"""Live-server fixtures: real `ninfer serve` subprocesses (gunicorn), real HTTP clients.

Starting a server costs a warm-up compile, so the whole suite shares as few as possible:
`live_server` is one session-wide server on the default artifact with a fixed seed, an API
key and a 1 MiB body limit (so 401 and 413 are testable on it); `server_factory(...)` starts
another one with other flags, reused when the same flags are asked for again. Every server
gets JAX's persistent compile cache (`.cache/jax`, as the Makefile sets), so later starts
load their executables instead of compiling them. All servers stop at the end of the session.

Servers start early: a module names them in EARLY_SERVERS (fixture name -> the factory's
arguments, for servers of the default artifact) or EARLY_STARTS (fixture name -> a function
of a folder that builds its artifact there and starts its own server: `early_or_now`), and
once the run's tests are collected, those of the selected tests' fixtures start one after
another in a background thread, in the order the tests need them and at most EARLY_AHEAD
ahead of the tests that take them, so a warm-up compile runs beside the tests before its
own instead of holding the suite; the factory hands an early server to the fixture that
asks for the same flags.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
NINFER = pathlib.Path(sys.executable).with_name("ninfer")
API_KEY = "e2e-secret"
SEED = 1234
# Small buckets keep the warm-up short: 1024-token context, 64-token prefill chunks.
BASE_FLAGS = ("--max-context", "1024", "--prefill-chunk", "64", "--max-concurrency", "4")
# Servers other than `live_server` compile only the essential step shapes (every step pads to
# one of them): a few shapes instead of 10-15, shared through the persistent cache.
FEW_SHAPES = ("--step-shapes", "essential")
STARTUP_TIMEOUT_S = float(os.environ.get("NINFER_E2E_STARTUP_TIMEOUT", "1200"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclasses.dataclass
class LiveServer:
    process: subprocess.Popen
    port: int
    api_key: str | None
    model_id: str
    log_path: pathlib.Path
    args: tuple
    first_health_at: float | None = None  # time.time() of /health's first answer

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def http(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=300, **kwargs)

    def openai(self, **kwargs):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.api_key or "unused",
                             max_retries=0, timeout=300, **kwargs)

    def stderr_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ninfer serve exited ({self.process.returncode}):\n"
                                   + self.stderr_text()[-4000:])
            try:
                # trust_env off: reading proxy settings walks os.environ, which races with
                # pytest's PYTEST_CURRENT_TEST when an early server waits on its thread
                health = httpx.get(self.url + "/health", timeout=2, trust_env=False)
                if self.first_health_at is None:
                    self.first_health_at = time.time()
                if health.status_code == 200:
                    return
                # A failed engine stays up and says so (serving.md); waiting on it would only
                # hold the suite until the deadline.
                if health.json().get("status") == "unavailable":
                    raise RuntimeError("ninfer serve's engine failed during start-up:\n"
                                       + self.stderr_text()[-4000:])
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.25)
        raise RuntimeError("ninfer serve did not become healthy in time:\n"
                           + self.stderr_text()[-4000:])

    def stop(self, wait: bool = True) -> None:
        """SIGTERM, then wait for the exit (killed after 30 s); wait=False leaves the wait
        to the session's end, for a module's server whose drain no later test needs."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            if not wait:
                _stopping.append(self)
                return
            self.reap()

    def reap(self) -> None:
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


# servers stopped with wait=False, reaped at the session's end
_stopping: list[LiveServer] = []


def environment() -> dict:
    """os.environ copied from any thread. Early servers start on background threads while
    pytest's main thread sets and pops PYTEST_CURRENT_TEST around every test, and copying the
    environment lists its keys before reading each: a key popped in between raised KeyError
    (a CI run lost a test to it)."""
    while True:
        try:
            env = dict(os.environ)
        except (KeyError, RuntimeError):  # changed while being copied: copy again
            continue
        env.pop("PYTEST_CURRENT_TEST", None)  # the server is no test
        return env


def start_server(artifact, *flags, api_key: str | None = None,
                 env_extra: dict | None = None) -> LiveServer:
    port = free_port()
    args = [str(NINFER), "serve", str(artifact), "--port", str(port), *flags]
    if api_key:
        args += ["--api-key", api_key]
    env = environment()
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / ".cache" / "jax"))
    env.update(env_extra or {})
    # in the session's folder, removed at its end (they piled up in /tmp, 455 of them)
    log_file = tempfile.NamedTemporaryFile(prefix="ninfer-serve-", suffix=".log", delete=False,
                                           dir=early_folder("logs"))
    process = subprocess.Popen(args, cwd=REPO, env=env, stdout=log_file,
                               stderr=subprocess.STDOUT, start_new_session=True)
    server = LiveServer(process, port, api_key, "smollm2-135m-instruct",
                        pathlib.Path(log_file.name), tuple(flags))
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def log_records(path, request_id, event, wait_s=10.0) -> list[dict]:
    """The `event` lines of one request in the request log at `path`. The log is written by
    a background thread after the reply is sent, so wait (up to `wait_s`) for at least one
    to land; an absence check passes wait_s=0 after a line that the server writes later has
    been seen."""
    deadline = time.monotonic() + wait_s
    while True:
        text = pathlib.Path(path).read_text(encoding="utf-8")
        found = [r for r in map(json.loads, text.splitlines())
                 if r.get("request_id") == request_id and r["event"] == event]
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def early_folder(name: str) -> pathlib.Path:
    """A folder for the files (request logs) of the early server `name`: the same path for
    the flags it starts with and for the fixture that reads them (one per pytest process)."""
    folder = pathlib.Path(tempfile.gettempdir()) / f"ninfer-e2e-{os.getpid()}" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# Servers started ahead of the test that takes them, at most. Each holds ~2 GB and its
# warm-up compile competes with the tests for CI's two cores: with every early server
# starting at once (nine servers of their own artifacts joined the default ones) the load
# stood at 5 for the suite's first 20 minutes and the suite's time doubled.
EARLY_AHEAD = 2


class EarlyStarts:
    """Server starts in the order the tests need them, on one background thread, never more
    than EARLY_AHEAD started and not yet both taken and ready. `take(key)` hands a started
    (or starting) server's future to its test; a start not begun yet is cancelled (the test
    starts it)."""

    def __init__(self, starts: dict):
        self._queue = list(starts.items())  # key -> (function, args, keywords), in order
        self._futures = {key: concurrent.futures.Future() for key in starts}
        self._ahead = 0
        self._changed = threading.Condition()
        threading.Thread(target=self._run, name="e2e-early-servers", daemon=True).start()

    def _run(self) -> None:
        for key, (function, args, keywords) in self._queue:
            with self._changed:
                self._changed.wait_for(lambda: self._ahead < EARLY_AHEAD)
                future = self._futures.get(key)
                if future is None or not future.set_running_or_notify_cancel():
                    continue  # taken (or the session ended) before it started
                self._ahead += 1
            try:
                future.set_result(function(*args, **keywords))
            except BaseException as exc:  # the test that takes it sees why
                future.set_exception(exc)

    def take(self, key) -> concurrent.futures.Future | None:
        """The early start of `key` for its test, or None (none, or not begun: cancelled)."""
        with self._changed:
            future = self._futures.pop(key, None)
            if future is None or future.cancel():
                return None
        future.add_done_callback(self._started)  # the next start waits for this one's
        return future

    def _started(self, _future) -> None:
        with self._changed:
            self._ahead -= 1
            self._changed.notify()

    def close(self) -> None:
        """Starts not begun are cancelled; servers started and never taken stop."""
        with self._changed:
            futures, self._futures = list(self._futures.values()), {}
            self._ahead = 0
            self._changed.notify()
        for future in futures:
            if not future.cancel():
                try:
                    future.result().stop()
                except Exception:  # it failed to start: nothing to stop
                    pass


_early: EarlyStarts | None = None


def _starter_key(starter) -> tuple:
    return (starter.__module__, starter.__qualname__)


def pytest_collection_finish(session):
    global _early
    if session.config.option.collectonly:
        return
    # key: (artifact, flags, api_key) of a factory server, or (module, name) of an
    # EARLY_STARTS function; value: (function, args, keywords), in the tests' order
    starts: dict[tuple, tuple] = {}
    for item in session.items:
        module = getattr(item, "module", None)
        declared = {**EARLY_SERVERS, **getattr(module, "EARLY_SERVERS", {})}
        starters = getattr(module, "EARLY_STARTS", {})
        for name in getattr(item, "fixturenames", ()):
            if name in declared:
                from ninfer_jax.artifact.default_model import ensure_default_artifact

                flags, api_key = declared[name]()
                artifact = str(ensure_default_artifact())
                starts.setdefault((artifact, tuple(flags), api_key),
                                  (start_server, (artifact, *flags), {"api_key": api_key}))
            elif name in starters:
                key = _starter_key(starters[name])
                starts.setdefault(key, (starters[name], (early_folder(".".join(key)),), {}))
    if starts:
        _early = EarlyStarts(starts)


def _take_early(key) -> concurrent.futures.Future | None:
    return _early.take(key) if _early is not None else None


def early_or_now(starter) -> LiveServer:
    """The server of starter(folder), a module's EARLY_STARTS function that builds an
    artifact in `folder` and starts its own server on it: the one started early, or one
    started now the same way."""
    key = _starter_key(starter)
    future = _take_early(key)
    return future.result() if future is not None else starter(early_folder(".".join(key)))


def pytest_sessionfinish(session):
    """Servers stopped without waiting are reaped; early servers that no test took (the run
    stopped first) stop here; their folders go."""
    while _stopping:
        _stopping.pop().reap()
    if _early is not None:
        _early.close()
    shutil.rmtree(pathlib.Path(tempfile.gettempdir()) / f"ninfer-e2e-{os.getpid()}",
                  ignore_errors=True)


@pytest.fixture(scope="session")
def server_factory(default_artifact_path):
    """start(*flags, api_key=None, artifact=None) -> LiveServer; same flags, same server."""
    servers: dict[tuple, LiveServer] = {}

    def start(*flags, api_key=None, artifact=None):
        key = (str(artifact or default_artifact_path), flags, api_key)
        if key not in servers:
            early = _take_early(key)
            servers[key] = early.result() if early else \
                start_server(artifact or default_artifact_path, *flags, api_key=api_key)
        return servers[key]

    yield start
    for server in servers.values():
        server.stop()


LIVE_SERVER_FLAGS = (*BASE_FLAGS, "--seed", str(SEED), "--max-request-mib", "1")
# fixture name -> () -> (flags, api_key) of its server_factory call; modules add their own
EARLY_SERVERS = {"live_server": lambda: (LIVE_SERVER_FLAGS, API_KEY)}


@pytest.fixture(scope="session")
def live_server(server_factory) -> LiveServer:
    return server_factory(*LIVE_SERVER_FLAGS, api_key=API_KEY)


def pytest_collection_modifyitems(config, items):
    """Every live-server test is `slow` (`make test-fast` deselects them)."""
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)
