"""An in-process server for `ninfer replay --artifact`: the real app and engine on a loopback
port, writing its own request log, for as long as the replay runs.

`serve_args` are `ninfer serve` options (parsed through the same declarations, so every
option and default is the same); pass the flags of the run you compare with, because chunk
sizes, concurrency and sampling overrides change numerics or seeds. The HTTP server is the standard library's
threaded WSGI server: one thread per connection, streaming bodies written as produced.
"""
from __future__ import annotations

import logging
import socketserver
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger("ninfer_jax.replay")


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass  # no access log: the request log covers requests


# `ninfer serve` options of the gunicorn front end and of its outputs, which this loopback
# server does not have: refused in --serve-args rather than ignored.
NOT_LOCAL = ("host", "port", "request_log_jsonl", "capture_requests", "log_stats_interval_ms",
             "http_workers", "http_threads", "header_timeout_s", "read_timeout_s",
             "max_connections", "shutdown_timeout_s")


def _refuse_front_end_options(config) -> None:
    import dataclasses

    from ninfer_jax.replay.records import ReplayInputError
    from ninfer_jax.serve.config import ServeConfig, option_of

    for field in dataclasses.fields(ServeConfig):
        if field.name in NOT_LOCAL and getattr(config, field.name) != field.default:
            flag = option_of(field).flag or "--" + field.name.replace("_", "-")
            hint = " (use replay's --server-log)" if field.name == "request_log_jsonl" else ""
            raise ReplayInputError(f"--serve-args: {flag} does not apply to the replay's "
                                   f"in-process server{hint}")


def serve_config(artifact: str, serve_args: list[str], request_log: str):
    """The ServeConfig `ninfer serve ARTIFACT ARGS...` would build, plus our request log."""
    import dataclasses

    import click

    from ninfer_jax.replay.records import ReplayInputError
    from ninfer_jax.serve.options import parse_serve_args

    try:
        config = parse_serve_args(artifact, serve_args)
    except click.ClickException as exc:  # its usage line would name a `serve` command
        raise ReplayInputError(f"--serve-args: {exc.format_message()}") from None
    _refuse_front_end_options(config)
    # the local server takes no key and writes the replay's own log
    return dataclasses.replace(config, request_log_jsonl=request_log, capture_requests=None,
                               api_key=None, log_stats_interval_ms=0)


class LocalServer:
    def __init__(self, artifact: str, serve_args: list[str], request_log: str):
        from ninfer_jax.replay.records import ReplayInputError
        from ninfer_jax.serve.launcher import check_startup

        self.config = serve_config(artifact, serve_args, request_log)
        try:
            check_startup(self.config)  # what `ninfer serve` refuses, before any weight is read
        except ValueError as exc:
            # The local server's request log is replay's --server-log.
            message = str(exc).replace("--request-log-jsonl", "--server-log", 1)
            raise ReplayInputError(message) from None
        self.ctx = None
        self._server = None
        self._thread = None

    def start(self, ready_timeout: float = 1800.0) -> str:
        """Load, warm up and listen; returns the base URL."""
        from ninfer_jax.serve.app import create_app
        from ninfer_jax.serve.engine_setup import build_local_context

        self.ctx = build_local_context(self.config)
        app = create_app(self.ctx)
        if not self.ctx.engine.wait_ready(ready_timeout) or not self.ctx.engine.healthy:
            raise RuntimeError("the in-process engine did not become ready")
        self._server = make_server("127.0.0.1", 0, app, server_class=_ThreadingServer,
                                   handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="ninfer-replay-http", daemon=True)
        self._thread.start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        from ninfer_jax.serve.observability.request_log import shutdown

        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.ctx is not None:
            self.ctx.engine.shutdown(timeout=10)
            shutdown(self.ctx)

    def __enter__(self) -> "LocalServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
