"""Fixtures of the reliability tests: `fake_server(**options)` starts tests/reliability/
fake_server.py (real gunicorn and ninfer's worker, fake model) and stops it at the end."""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "serve"))  # the fake-model harness (tests/serve/harness.py)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclasses.dataclass
class FakeServer:
    process: subprocess.Popen
    port: int
    log_path: pathlib.Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"fake server exited:\n{self.stderr_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"fake server not ready:\n{self.stderr_text()[-3000:]}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


@pytest.fixture(scope="module")
def fake_server(default_artifact_path, tmp_path_factory):
    """Starting one costs about 3 s: share one per module where the options allow."""
    started = []
    tmp_path = tmp_path_factory.mktemp("servers")

    def start(**options) -> FakeServer:
        port = free_port()
        options = {"port": port, "log_stats_interval_ms": 0, **options}
        log_path = tmp_path / f"server-{port}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, str(HERE / "fake_server.py"), str(default_artifact_path),
                 json.dumps(options)], stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        server = FakeServer(process, port, log_path)
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait(10)
