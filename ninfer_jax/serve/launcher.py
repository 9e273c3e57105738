"""`run_server(config)`: gunicorn, run programmatically, serving one resident engine.

One worker process (gthread, `config.http_threads` HTTP threads). Nothing heavy happens in the
master: the app is loaded in the worker after the fork (no preload), so the engine thread and
the device belong to the process that serves requests. Loading reads the artifact, builds the
JaxRunner and the Engine and starts the engine thread, which compiles every step bucket
(warm-up) before /health reports ok. With `--kv-capacity auto` the weights are placed on the
device first and the pool is sized from the memory left (serve/kv_sizing.py); so is the
default pool (one context per lane) when several lanes are asked for. No worker
timeout (a long stream is not a hung worker), no control socket, graceful shutdown that
stops the engine.

Stderr records read `YYYY-MM-DD HH:MM:SS.mmm LEVEL message` (gunicorn's own included).
"""
from __future__ import annotations

import dataclasses
import logging
import logging.config
import socket
import sys

from gunicorn.app.base import BaseApplication

from ninfer_jax.serve import kv_sizing
from ninfer_jax.serve.config import ServeConfig

log = logging.getLogger("ninfer_jax.serve")

LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
          "warning": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL,
          "off": logging.CRITICAL + 10}
GRACEFUL_TIMEOUT_S = 10
# A dead peer is noticed within about 20 s: TCP keepalive probes plus a user timeout.
TCP_USER_TIMEOUT_MS = 15000


def logging_config(level: str) -> dict:
    numeric = LEVELS[level]
    handler = {"class": "logging.StreamHandler", "formatter": "ninfer", "stream": "ext://sys.stderr"}
    return {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"ninfer": {"format": LOG_FORMAT, "datefmt": DATE_FORMAT}},
        "handlers": {"stderr": handler},
        # Third-party libraries (jax, orbax, absl) only speak up from warning on, unless debug.
        "root": {"level": min(max(numeric, logging.WARNING), logging.CRITICAL + 10)
                 if numeric > logging.DEBUG else numeric, "handlers": ["stderr"]},
        "loggers": {
            "ninfer_jax": {"level": numeric},
            "gunicorn.error": {"level": numeric, "handlers": ["stderr"], "propagate": False},
            "gunicorn.access": {"level": logging.CRITICAL + 10, "propagate": False},
        },
    }


class _KeepAliveSockets:
    """WSGI wrapper: sets TCP keepalive / user timeout on each accepted connection."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        sock = environ.get("gunicorn.socket")
        if sock is not None:
            _tune_socket(sock)
        return self.app(environ, start_response)


def _tune_socket(sock) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 5)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS)
    except OSError:
        pass  # not a TCP socket (tests, unix sockets): nothing to tune


def build_context(config: ServeConfig):
    """Load the artifact, build runner + engine (started: warm-up runs in its thread)."""
    from ninfer_jax.artifact.format import load_artifact
    from ninfer_jax.engine.config import EngineConfig
    from ninfer_jax.engine.engine import Engine
    from ninfer_jax.engine.runner import JaxRunner, default_dtype, kv_dtype_for
    from ninfer_jax.serve.context import ServingContext
    from ninfer_jax.text.chat_template import ChatRenderer

    artifact = load_artifact(config.artifact, weights=True)
    tokenizer = artifact.load_tokenizer()
    template = artifact.chat_template
    if config.chat_template:
        with open(config.chat_template, encoding="utf-8") as handle:
            template = handle.read()
    max_context = min(config.max_context, artifact.config.max_position_embeddings)
    page_size = 16
    kv_dtype = kv_dtype_for(config.kv_dtype)
    artifact, kv_tokens = kv_sizing.resolve_pool(config, artifact, default_dtype(), kv_dtype,
                                                 max_context=max_context, page_size=page_size)
    engine_config = EngineConfig.from_serve_config(config, resolved_kv_tokens=kv_tokens)
    if max_context != config.max_context:
        log.warning("--max-context %d exceeds the model's %d positions; using %d",
                    config.max_context, max_context, max_context)
        engine_config = dataclasses.replace(engine_config, max_context=max_context)
    runner = JaxRunner(artifact, num_pages=engine_config.num_pages(page_size),
                       page_size=page_size, max_batch=config.max_concurrency,
                       max_context=max_context, prefill_chunk=config.prefill_chunk,
                       kv_dtype=kv_dtype)
    engine = Engine(runner, engine_config, eos_ids=artifact.eos_ids)
    engine.start()
    log.info("model %s (%s): context %d tokens, KV pool %d tokens of %s, %d lanes; warming up",
             artifact.name, artifact.config.architecture, max_context, engine.pool_tokens,
             runner.kv_dtype.name, config.max_concurrency)
    return ServingContext(
        engine=engine, tokenizer=tokenizer,
        renderer=ChatRenderer(template, tokenizer, artifact.chat_format),
        model_id=config.model_id or artifact.name, config=config, metadata=artifact.metadata,
        max_context=max_context)


class NinferApplication(BaseApplication):
    def __init__(self, config: ServeConfig):
        self.config = config
        self.ctx = None
        super().__init__()

    def load_config(self) -> None:
        config = self.config
        settings = {
            "bind": [f"[{config.host}]:{config.port}" if ":" in config.host
                     else f"{config.host}:{config.port}"],
            "workers": 1, "worker_class": "gthread", "threads": config.http_threads,
            "timeout": 0, "graceful_timeout": GRACEFUL_TIMEOUT_S, "keepalive": 5,
            "preload_app": False, "control_socket_disable": True, "accesslog": None,
            "logconfig_dict": logging_config(config.log_level),
            "proc_name": "ninfer-serve", "worker_exit": self._worker_exit,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self):
        # Runs in the worker process, after the fork.
        from ninfer_jax.serve.app import create_app

        self.ctx = build_context(self.config)
        return _KeepAliveSockets(create_app(self.ctx))

    def _worker_exit(self, server, worker) -> None:
        if self.ctx is not None:
            from ninfer_jax.serve.request_log import shutdown as close_logs

            log.info("shutting down the engine")
            self.ctx.engine.shutdown(timeout=GRACEFUL_TIMEOUT_S)
            close_logs(self.ctx)


def run_server(config: ServeConfig) -> None:
    from ninfer_jax.artifact.format import load_artifact
    from ninfer_jax.errors import ArtifactError

    logging.config.dictConfig(logging_config(config.log_level))
    try:
        artifact = load_artifact(config.artifact, weights=False)  # fail fast, before any fork
    except ArtifactError as exc:
        log.error("cannot serve: %s", exc)
        sys.exit(2)
    if config.vision and not artifact.components.get("vision"):
        log.error("cannot serve: --vision needs an artifact with a vision component; %s has "
                  "none (serve it without --vision: media input is then refused with "
                  "vision_disabled)", config.artifact)
        sys.exit(2)
    from ninfer_jax.serve.request_log import check_paths

    try:
        check_paths(config)  # an unusable log or capture file stops start-up here
    except ValueError as exc:
        log.error("cannot serve: %s", exc)
        sys.exit(2)
    log.info("starting ninfer-jax on http://%s:%d (artifact %s)", config.host, config.port,
             config.artifact)
    NinferApplication(config).run()
