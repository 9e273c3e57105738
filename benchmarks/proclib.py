"""Time caps, subprocesses, a server's readiness timeline and JSON-line results for the
device benchmark driver (benchmarks/gpu_serve_bench.py). Standard library only: the driver
runs before the carried wheels are installed.

Every command runs in its own process group, so a cap kills the command and whatever it
started (a server's gunicorn worker included), never anything else.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # every command's cwd
MIN_STAGE_S = 5.0  # a stage with less time than this left is skipped, not started
HEALTH_POLL_S = 0.25
MAX_HEALTH_TRACE = 200


class Budget:
    """Stage caps bounded by what is left of the call."""

    def __init__(self, total_s: float, reserve_s: float):
        self.deadline = time.monotonic() + total_s - reserve_s

    def cap(self, wanted_s: float) -> float | None:
        left = min(wanted_s, self.deadline - time.monotonic())
        return left if left >= MIN_STAGE_S else None


class Results:
    """Appends one JSON object per measurement to results.jsonl and echoes it."""

    def __init__(self, path: str):
        self.path, self.started, self.rows = path, time.monotonic(), []

    def add(self, stage: str, command: list[str] | str, **fields) -> dict:
        row = {"stage": stage, "command": command if isinstance(command, str)
               else shlex.join(command), "at_s": round(time.monotonic() - self.started, 2),
               **fields}
        self.rows.append(row)
        with open(self.path, "a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
        return row


def run_capped(command: list[str], cap_s: float, log_path: str, env: dict) -> dict:
    """Run to completion or kill its whole process group at the cap. stdout is returned and
    logged; stderr goes to the log."""
    with open(log_path, "a") as log:
        log.write(f"\n===== {shlex.join(command)} (cap {cap_s:.0f} s)\n")
        log.flush()
        started = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env=env, cwd=REPO,
                                text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=cap_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            timed_out = True
        log.write(out)
    return {"rc": proc.returncode, "seconds": round(time.monotonic() - started, 2),
            "timed_out": timed_out, "stdout": out}


def http_get(url: str, timeout: float = 2.0) -> tuple[int | None, str]:
    """(status, body); status None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, ValueError):
        return None, ""


def parse_metrics(text: str, names) -> dict:
    """The named counters of a Prometheus text page, each summed over its labels; a name
    given as `name:label` keeps one entry per value of that label (`name:label=value`)."""
    split = {n.split(":")[0]: n.split(":")[1] for n in names if ":" in n}
    values: dict = {}
    for line in text.splitlines():
        match = re.match(r"^([a-z_]+)(?:\{([^}]*)\})?\s+([-+0-9.eE]+|NaN)$", line)
        if not match:
            continue
        name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
        if name in split:
            label = re.search(split[name] + r'="([^"]*)"', labels)
            key = f"{name}:{split[name]}={label.group(1) if label else ''}"
            values[key] = values.get(key, 0.0) + value
        elif name in names:
            values[name] = values.get(name, 0.0) + value
    return values


class Server:
    """One `ninfer serve` process group, its readiness timeline and its shutdown."""

    def __init__(self, command: list[str], env: dict, log_path: str, url: str):
        self.command, self.env, self.log_path, self.url = command, env, log_path, url
        self.proc = None

    def start_and_wait(self, cap_s: float) -> dict:
        """Seconds from process start to the first answer and to /health ok, with every
        distinct /health reply (status, parsed body) and when it was first seen."""
        log = open(self.log_path, "a")
        self.log_offset = log.tell()  # this start's lines begin here (the file is shared)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                     env=self.env, cwd=REPO, start_new_session=True)
        log.close()
        trace, listening, ready, last = [], None, None, None
        while time.monotonic() - self.started < cap_s and self.proc.poll() is None:
            status, body = http_get(self.url + "/health")
            now = round(time.monotonic() - self.started, 3)
            if status is not None and listening is None:
                listening = now
            if status is not None and (status, body) != last and len(trace) < MAX_HEALTH_TRACE:
                trace.append({"t_s": now, "status": status, "body": json_or_text(body)})
                last = (status, body)
            if status == 200:
                ready = now
                break
            time.sleep(HEALTH_POLL_S)
        return {"listening_s": listening, "ready_s": ready, "timed_out": ready is None and
                self.proc.poll() is None, "exit_rc": self.proc.poll(), "health": trace}

    def wait_compiled(self, cap_s: float) -> dict:
        """Poll /health until every step shape has compiled (GPU servers are ready after a
        few and compile the rest in the background); seconds waited and the last counts."""
        started = time.monotonic()
        body = {}
        while time.monotonic() - started < cap_s and self.proc.poll() is None:
            status, text = http_get(self.url + "/health")
            body = json_or_text(text)
            if isinstance(body, dict) and body.get("total_shapes") and (
                    body.get("compiled_shapes") == body.get("total_shapes")):
                return {"compiled_wait_s": round(time.monotonic() - started, 3),
                        "compiled_shapes": body.get("compiled_shapes"), "all_compiled": True}
            time.sleep(0.5)
        return {"compiled_wait_s": round(time.monotonic() - started, 3),
                "compiled_shapes": body.get("compiled_shapes") if isinstance(body, dict)
                else None, "all_compiled": False}

    def log_lines(self, pattern: str, limit: int = 20) -> list[str]:
        """This start's log lines matching the regex (the first `limit` of them)."""
        with open(self.log_path, errors="replace") as log:
            log.seek(self.log_offset)
            return [line.rstrip() for line in log if re.search(pattern, line)][:limit]

    def stop(self, grace_s: float = 30.0) -> float:
        """SIGTERM (gunicorn's graceful stop), then SIGKILL to the group after grace_s (at once
        when 0); seconds it took."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        started = time.monotonic()
        if grace_s > 0:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:  # whatever of the group is left (a worker still loading ignores SIGTERM)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        return round(time.monotonic() - started, 2)


def json_or_text(body: str):
    try:
        return json.loads(body)
    except ValueError:
        return body[:500]


def dir_size(path: str) -> dict:
    """Files and MiB under path (0 and 0 when it does not exist)."""
    files = [f for f in glob.glob(os.path.join(path, "**"), recursive=True) if os.path.isfile(f)]
    return {"files": len(files), "mib": round(sum(map(os.path.getsize, files)) / 2 ** 20, 1)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
