"""The JSONL request log (--request-log-jsonl) and the observability services of a worker.

Owns: the path checks made before the server forks (the parent directory exists, the path is
not the model artifact nor inside it, the file opens for append), the writer, the fields every
line carries (`event`, `schema`, `schema_version`, `timestamp_unix_ms`,
`server_instance_id`), argv redaction and the `server_start` record. `register(app, ctx)`
builds the per-worker services: the writer (when configured), the `RequestObserver` the
generation path reports to (always: /metrics needs it too), the engine's scheduling listener
and the periodic throughput reporter.

Threading: `JsonlWriter.emit` may be called from any thread, the engine thread included; it
only stamps the record and puts it on a queue. One writer thread serializes, writes and
flushes each line in queue order, so lines never interleave and nobody waits on the disk.
Records hold ids, counts and seconds only: never prompt or generated text, never the API key.
"""
from __future__ import annotations

import json
import logging
import os
import pathlib
import platform
import queue
import sys
import threading
import time
import uuid

log = logging.getLogger("ninfer_jax.serve.request_log")

SCHEMA = "ninfer_serve_request_log"
SCHEMA_VERSION = 1
REDACTED = "<redacted>"
# Options whose value is a credential: argv shows them as <redacted>.
SECRET_OPTIONS = ("--api-key",)
_STOP = object()


def check_output_path(path: str, artifact: str, option: str) -> None:
    """Raise ValueError with a readable reason when `path` cannot be appended to by a server
    on `artifact` (used for --request-log-jsonl and --capture-requests)."""
    target = pathlib.Path(path).expanduser()
    parent = target.parent if str(target.parent) else pathlib.Path(".")
    if not parent.is_dir():
        raise ValueError(f"{option} {path}: the directory {parent} does not exist")
    resolved = target.resolve()
    model = pathlib.Path(artifact).expanduser().resolve()
    if resolved == model or model in resolved.parents:
        raise ValueError(f"{option} {path}: the path resolves to the model artifact {model}")
    if resolved.is_dir():
        raise ValueError(f"{option} {path}: is a directory")
    try:
        with open(resolved, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot open for append ({exc.strerror})") from None


def check_paths(config) -> None:
    """Start-up check of every file the observability options append to (ValueError)."""
    for option, path in (("--request-log-jsonl", config.request_log_jsonl),
                         ("--capture-requests", config.capture_requests)):
        if path:
            check_output_path(path, config.artifact, option)


def redact_argv(argv) -> list[str]:
    """argv with every credential value replaced (`--api-key V` and `--api-key=V`)."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if name in SECRET_OPTIONS:
            out.append(f"{name}={REDACTED}" if eq else arg)
            hide_next = not eq
        else:
            out.append(arg)
    return out


def _jsonable(value):
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return str(value)


def now_unix_ms() -> int:
    return time.time_ns() // 1_000_000


class JsonlWriter:
    """Appends one JSON object per line to `path`, flushed after every line."""

    def __init__(self, path: str, server_instance_id: str, *, schema: str = SCHEMA,
                 schema_version: int = SCHEMA_VERSION):
        self.path = path
        self.server_instance_id = server_instance_id
        self.schema, self.schema_version = schema, schema_version
        self._file = open(path, "a", encoding="utf-8")
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._drain, name="ninfer-jsonl", daemon=True)
        self._thread.start()

    def emit(self, event: str, record: dict) -> None:
        """Queue one line; `record` must not be mutated afterwards."""
        self._queue.put({"event": event, "schema": self.schema,
                         "schema_version": self.schema_version,
                         "timestamp_unix_ms": now_unix_ms(),
                         "server_instance_id": self.server_instance_id, **record})

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every line queued so far is on disk."""
        written = threading.Event()
        self._queue.put(written)
        return written.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._file.write(json.dumps(item, ensure_ascii=False, default=_jsonable) + "\n")
                self._file.flush()
            except (OSError, ValueError, TypeError):
                log.exception("cannot write the request log line (%s)", item.get("event"))
        self._file.close()


# ----------------------------------------------------------------------------- server_start


def _runtime(engine) -> dict:
    info = {"pid": os.getpid(), "python": platform.python_version(),
            "platform": platform.platform(terse=True)}
    runtime = getattr(engine, "runtime", None)  # an engine-core client: JAX runs there
    if runtime is not None:
        return {**info, **runtime}  # its "mesh": the runner's devices (tensor parallelism)
    jax = sys.modules.get("jax")  # only describe JAX when the server already uses it
    if jax is not None:
        try:
            devices = jax.devices()
            info.update(jax=jax.__version__, backend=jax.default_backend(),
                        devices=[getattr(d, "device_kind", str(d)) for d in devices])
        except Exception:  # noqa: BLE001 - describing the runtime must never stop start-up
            info["jax"] = getattr(jax, "__version__", None)
    return info


def server_start_record(ctx) -> dict:
    from ninfer_jax.serve.core.sampling import model_defaults

    config, engine = ctx.config, ctx.engine
    stats = engine.stats()
    engine_config = getattr(engine, "config", None)
    return {
        "artifact": {
            "path": str(pathlib.Path(config.artifact).resolve()),
            "name": ctx.metadata.get("name"), "architecture": ctx.architecture,
            "public_model_id": ctx.model_id,
            "weight_formats": ctx.metadata.get("weight_formats"),
            "tool_call_format": ctx.tool_call_format,
            "has_reasoning_markers": ctx.reasoning_markers is not None,
        },
        "engine": {  # what the engine runs with (the flags, after start-up resolution)
            "max_concurrency": stats.max_concurrency,
            "max_pending_requests": getattr(engine_config, "max_pending",
                                            config.max_pending_requests),
            "max_context_tokens": ctx.max_context,
            "prefill_chunk": getattr(engine_config, "prefill_chunk", config.prefill_chunk),
            "decode_share": getattr(engine_config, "decode_share", config.decode_share),
            "pending_timeout_ms": config.pending_timeout_ms,
            "prefix_reuse": getattr(engine_config, "prefix_reuse", not config.no_prefix_reuse),
            "kv_dtype": config.kv_dtype,
            "speculative": ({"backend": config.spec, "draft_tokens": config.draft_tokens}
                            if config.spec else None),
            "kv_page_size": stats.page_size,
            "kv_capacity_pages": stats.kv_pages_capacity,
            "kv_capacity_tokens": stats.page_size * stats.kv_pages_capacity,
            "max_outstanding": getattr(engine_config, "max_outstanding", None),
            "state_slots_capacity": getattr(stats, "state_slots_capacity", 0),
        },
        "sampling": {
            "thinking_defaults": model_defaults(ctx.model_name, ctx.architecture, True),
            "non_thinking_defaults": model_defaults(ctx.model_name, ctx.architecture, False),
            "process_overrides": {k: v for k, v in vars(config.sampling).items()},
        },
        "thinking": {
            "default_enabled": ctx.thinking_default and not config.no_thinking,
            "preserve_thinking": config.preserve_thinking,
            "default_thinking_budget": config.default_thinking_budget,
        },
        "default_max_tokens": config.default_max_tokens,
        "observability": {
            "log_stats_interval_ms": config.log_stats_interval_ms,
            "log_level": config.log_level,
            "capture_requests": config.capture_requests is not None,
        },
        "runtime": _runtime(engine),
        "argv": redact_argv(config.argv),
    }


# ----------------------------------------------------------------------------- wiring


def server_instance_id(ctx) -> str:
    """One id per worker process, shared by the request log and the capture file."""
    return ctx.extras.setdefault("server_instance_id", uuid.uuid4().hex)


def register(app, ctx) -> None:
    from ninfer_jax.serve.observability.request_trace import RequestObserver
    from ninfer_jax.serve.observability.throughput import ThroughputReporter

    writer = None
    if ctx.config.request_log_jsonl:
        writer = JsonlWriter(ctx.config.request_log_jsonl, server_instance_id(ctx))
        writer.emit("server_start", server_start_record(ctx))
    observer = RequestObserver(ctx, writer)
    ctx.extras["request_log"] = writer
    ctx.extras["observer"] = observer
    add_listener = getattr(ctx.engine, "add_scheduling_listener", None)
    if writer is not None and add_listener is not None:
        # No request exists yet, so no scheduling event can be missed.
        add_listener(observer.on_scheduling)
    observer.start()
    interval_ms = ctx.config.log_stats_interval_ms
    # With several HTTP workers the engine core reports throughput once (engine_setup.py).
    if interval_ms > 0 and ctx.config.http_workers == 1:
        reporter = ThroughputReporter(ctx.engine, interval_ms / 1000.0, writer)
        ctx.extras["throughput"] = reporter
        reporter.start()


def shutdown(ctx) -> None:
    """Stop the worker's reporter threads and flush the JSONL files (worker exit)."""
    for name in ("throughput", "observer"):
        service = ctx.extras.get(name)
        if service is not None:
            service.stop()
    for name in ("request_log", "capture"):
        writer = ctx.extras.get(name)
        if writer is not None:
            writer.close()
