"""`run_server(config)`: the engine-core process plus gunicorn's HTTP workers around it.

The launcher (gunicorn's master process) first starts the engine core
(engine/core_process.py, spawned: the only process that imports JAX; serve/engine_setup.py
says what it builds and with which environment: --device, --no-cuda-graph) and waits until
its socket listens. Then gunicorn forks `--http-workers` gthread workers
(`--http-threads` HTTP threads each). Each worker loads the artifact without weights
(tokenizer, template, metadata) and connects an EngineClient, which waits until the core has
built its engine; meanwhile the worker already answers /health "loading" and holds other
requests (_WhileBuilding), and warm-up goes on in the core while /health says so. No worker
timeout (a long stream is not a hung worker), no control socket. Shutdown (SIGTERM, SIGINT)
stops the workers gracefully, then the core; if the launcher dies, the core sees its control
pipe close and stops too.

Several workers share one engine; what a worker keeps for itself is refused or shared:
the Responses store and the JSONL files (request log, capture) need `--http-workers 1`;
/metrics' request counters go through prometheus_client's multiprocess files; the throughput
report runs in the core.

Stderr records read `YYYY-MM-DD HH:MM:SS.mmm LEVEL message` (gunicorn's own included).
"""
from __future__ import annotations

import errno
import json
import logging
import logging.config
import math
import os
import shutil
import socket
import sys
import tempfile
import threading

from gunicorn.app.base import BaseApplication

from ninfer_jax.serve import engine_setup
from ninfer_jax.serve.config import ServeConfig, http_threads_per_worker

log = logging.getLogger("ninfer_jax.serve")

LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
          "warning": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL,
          "off": logging.CRITICAL + 10}
SHUTDOWN_MARGIN_S = 10
WORKER_BOOT_ERROR = 3  # gunicorn's exit status for a worker that could not start
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


class _WhileBuilding:
    """WSGI app of a worker whose engine core is still reading the weights (no engine to ask
    yet): GET / HEAD /health answer 503 {"status": "loading"} at once, other requests wait
    for the real app, then go to it. Before, the worker only started accepting once the core
    had built its engine, so /health hung for the weights' 10-20 s (run 45: first answer
    18.0 s into an 8B restart)."""

    LOADING = json.dumps({"status": "loading", "compiled_shapes": 0,
                          "total_shapes": 0}).encode()

    def __init__(self):
        self._built = threading.Event()
        self._app = None

    def serve(self, app) -> None:
        self._app = app
        self._built.set()

    def __call__(self, environ, start_response):
        if not self._built.is_set():
            if (environ.get("PATH_INFO") == "/health"
                    and environ.get("REQUEST_METHOD") in ("GET", "HEAD")):
                start_response("503 Service Unavailable", [
                    ("Content-Type", "application/json"),
                    ("Content-Length", str(len(self.LOADING)))])
                return [] if environ["REQUEST_METHOD"] == "HEAD" else [self.LOADING]
            self._built.wait()  # a worker whose core failed exits (_build_worker_app)
        return self._app(environ, start_response)


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


def serving_context(config: ServeConfig, artifact, engine):
    """The worker's ServingContext: the artifact's text side around `engine` (an
    EngineClient, or an in-process Engine for replay), whose config gives the context."""
    from ninfer_jax.serve.core.context import ServingContext
    from ninfer_jax.text.chat_template import ChatRenderer

    tokenizer = artifact.load_tokenizer()
    template = artifact.chat_template
    if config.chat_template:
        with open(config.chat_template, encoding="utf-8") as handle:
            template = handle.read()
    return ServingContext(
        engine=engine, tokenizer=tokenizer,
        renderer=ChatRenderer(template, tokenizer, artifact.chat_format),
        model_id=config.model_id or artifact.name, config=config, metadata=artifact.metadata,
        max_context=engine.config.max_context)


def build_worker_context(config: ServeConfig, address: str, authkey: bytes):
    """In an HTTP worker: connect to the engine core and wait until its engine is built."""
    from ninfer_jax.artifact.format import load_artifact
    from ninfer_jax.engine.core_client import EngineClient

    artifact = load_artifact(config.artifact, weights=False)
    client = EngineClient(address, authkey)
    client.wait_built()
    return serving_context(config, artifact, client)


def check_text_side(config: ServeConfig, artifact) -> None:
    """ValueError when the tokenizer or the chat template (--chat-template's file, else the
    artifact's) cannot be built: each worker builds both after the engine core has read the
    weights, where a failure was a worker traceback."""
    from ninfer_jax.artifact.format import TEMPLATE_FILE
    from ninfer_jax.errors import ArtifactError
    from ninfer_jax.text.chat_template import compile_template

    try:
        artifact.load_tokenizer()
    except ArtifactError as exc:
        raise ValueError(str(exc)) from None
    if not config.chat_template:
        try:
            compile_template(artifact.chat_template)
        except ValueError as exc:
            raise ValueError(f"{artifact.path / TEMPLATE_FILE}: {exc}") from None
        return
    try:
        with open(config.chat_template, encoding="utf-8") as handle:
            compile_template(handle.read())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"--chat-template {config.chat_template}: {exc}") from None


def check_http_workers(config: ServeConfig) -> None:
    """ValueError for options whose state lives in one worker, with several workers."""
    if config.http_workers == 1:
        return
    if config.response_store_max_records > 0 and config.response_store_max_mib > 0:
        raise ValueError(f"--http-workers {config.http_workers}: the Responses store is kept "
                         "per worker (previous_response_id and GET /v1/responses/{id} would "
                         "miss on the other workers); turn it off with "
                         "--response-store-max-records 0, or serve with --http-workers 1")
    for option, value in (("--request-log-jsonl", config.request_log_jsonl),
                          ("--capture-requests", config.capture_requests)):
        if value:
            raise ValueError(f"--http-workers {config.http_workers}: {option} is written by "
                             "one worker process; serve with --http-workers 1 to use it")


def gunicorn_settings(config: ServeConfig) -> dict:
    """gunicorn's settings for `config` (the process-model hooks are the caller's)."""
    from ninfer_jax.serve.wire.http_worker import ConnectionLimits, worker_class

    limits = ConnectionLimits(config.header_timeout_s, config.read_timeout_s,
                              config.max_connections, config.shutdown_timeout_s)
    return {
        "bind": [f"[{config.host}]:{config.port}" if ":" in config.host
                 else f"{config.host}:{config.port}"],
        "workers": config.http_workers, "worker_class": worker_class(limits),
        "threads": http_threads_per_worker(config), "worker_connections": limits.max_connections,
        # The master kills a worker this long after SIGTERM; the worker ends its requests
        # after --shutdown-timeout and needs a moment more to close the engine and the logs.
        "timeout": 0, "graceful_timeout": math.ceil(config.shutdown_timeout_s + SHUTDOWN_MARGIN_S),
        "keepalive": 5,
        "preload_app": False, "control_socket_disable": True, "accesslog": None,
        "logconfig_dict": logging_config(config.log_level), "proc_name": "ninfer-serve",
    }


class NinferApplication(BaseApplication):
    def __init__(self, config: ServeConfig, core):
        self.config = config
        self.core = core  # engine/core_process.CoreProcess
        self.ctx = None
        super().__init__()

    def load_config(self) -> None:
        settings = gunicorn_settings(self.config)
        settings.update(post_fork=self._post_fork, worker_exit=self._worker_exit)
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self):
        # Runs in the worker process, after the fork: the app is built on a thread while
        # the worker already answers (_WhileBuilding).
        app = _WhileBuilding()
        threading.Thread(target=self._build_worker_app, args=(app,),
                         name="ninfer-worker-build", daemon=True).start()
        return _KeepAliveSockets(app)

    def _build_worker_app(self, app: _WhileBuilding) -> None:
        from ninfer_jax.errors import EngineUnavailable
        from ninfer_jax.serve.app import create_app

        try:
            self.ctx = build_worker_context(self.config, self.core.address, self.core.authkey)
            app.serve(create_app(self.ctx))
        except EngineUnavailable:
            # The core has logged why in one line; a worker traceback would bury it.
            log.error("cannot serve: the engine core stopped during start-up")
            self._boot_failed()
        except BaseException:
            log.exception("cannot serve: the HTTP worker could not start")
            self._boot_failed()

    @staticmethod
    def _boot_failed() -> None:
        """Leave with gunicorn's boot-failure status (its master then stops the server),
        from this thread: sys.exit would only end the thread."""
        logging.shutdown()
        os._exit(WORKER_BOOT_ERROR)

    def _post_fork(self, server, worker) -> None:
        self.core.close_in_child()

    def _worker_exit(self, server, worker) -> None:
        if self.ctx is not None:
            from ninfer_jax.serve.observability.request_log import shutdown as close_logs

            self.ctx.engine.shutdown(timeout=SHUTDOWN_MARGIN_S / 2)
            close_logs(self.ctx)

    def abort_in_flight(self) -> int:
        # Called by the stopping worker (serve/wire/http_worker.py) after --shutdown-timeout.
        return self.ctx.in_flight.abort_all() if self.ctx is not None else 0

    def run(self) -> None:
        from ninfer_jax.serve.wire.http_worker import GracefulArbiter

        try:
            GracefulArbiter(self).run()
        except RuntimeError as exc:
            log.error("cannot serve: %s", exc)
            sys.exit(1)


def check_port(host: str, port: int) -> None:
    """OSError with a plain message when (host, port) cannot be bound: in use, not allowed,
    or not an address of this machine."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            reasons = {errno.EADDRINUSE: "is already in use (another server is running "
                                         "there; stop it or pick another --port)",
                       errno.EACCES: "needs privileges to bind (pick a --port above 1023)",
                       errno.EADDRNOTAVAIL: "is not an address of this machine (--host)"}
            reason = reasons.get(exc.errno, f"cannot be bound ({exc.strerror})")
            raise OSError(f"{host}:{port} {reason}") from None


def check_startup(config: ServeConfig) -> None:
    """The start-up checks that need no engine (the artifact's metadata, option files and
    combinations): ValueError with a one-line message naming the option or the file.
    `ninfer serve` and `ninfer replay --artifact` both run them before building anything."""
    from ninfer_jax.artifact.format import load_artifact
    from ninfer_jax.errors import ArtifactError
    from ninfer_jax.serve.observability.request_log import check_paths

    try:
        artifact = load_artifact(config.artifact, weights=False)
    except ArtifactError as exc:
        raise ValueError(str(exc)) from None
    if config.vision and not artifact.components.get("vision"):
        raise ValueError(f"--vision needs an artifact with a vision component; "
                         f"{config.artifact} has none (serve it without --vision: media "
                         "input is then refused with vision_disabled)")
    check_paths(config)  # an unusable log or capture file
    check_text_side(config, artifact)
    check_http_workers(config)
    engine_setup.check_speculation(config, artifact.config, artifact.components)
    engine_setup.check_weights(config, artifact.weight_formats, artifact.config)
    if config.tensor_parallel != "auto":  # 'auto' needs the core's device count
        artifact.config.check_tensor_parallel(int(config.tensor_parallel),
                                              config.expert_parallel)


def describe_core(config: ServeConfig, core_env, environ) -> str:
    """The start-up line saying what the engine core's environment selects."""
    # --tensor-parallel auto leaves the variable as it is, maybe unset (every device)
    visible = core_env.get("CUDA_VISIBLE_DEVICES",
                           environ.get("CUDA_VISIBLE_DEVICES", "unset: every device"))
    flags = f" (XLA_FLAGS={core_env['XLA_FLAGS']})" if "XLA_FLAGS" in core_env else ""
    return (f"engine core: --device {config.device} (CUDA_VISIBLE_DEVICES={visible}), CUDA "
            f"graphs {'off' if config.no_cuda_graph else 'on'}{flags}, up to "
            f"{100 * config.gpu_memory_utilization:g}% of each GPU's memory; "
            f"{config.http_workers} HTTP worker(s)")


def run_server(config: ServeConfig) -> None:
    logging.config.dictConfig(logging_config(config.log_level))
    try:
        check_startup(config)  # fail fast, before any fork
        core_env = engine_setup.core_environment(config, os.environ)
    except ValueError as exc:
        log.error("cannot serve: %s", exc)
        sys.exit(2)
    try:
        check_port(config.host, config.port)  # before the weights are read, not after
    except OSError as exc:
        log.error("cannot serve: %s", exc)
        sys.exit(2)
    log.info("starting ninfer-jax on http://%s:%d (artifact %s)", config.host, config.port,
             config.artifact)
    log.info("%s", describe_core(config, core_env, os.environ))
    _serve(config)


def _serve(config: ServeConfig) -> None:
    from ninfer_jax.engine.core_process import start_core

    run_dir = tempfile.mkdtemp(prefix="ninfer-serve-")
    core = start_core(engine_setup.core_spec(config, os.environ),
                      os.path.join(run_dir, "engine-core.sock"))
    launcher_pid = os.getpid()
    try:
        core.wait_listening()
        if config.http_workers > 1:
            # Read by prometheus_client when a worker first imports it (serve/observability/metrics.py).
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.path.join(run_dir, "metrics")
            os.mkdir(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        NinferApplication(config, core).run()
    finally:
        # gunicorn's forked workers unwind this stack too: only the launcher cleans up.
        if os.getpid() == launcher_pid:
            log.info("stopping the engine core")
            core.stop()
            shutil.rmtree(run_dir, ignore_errors=True)
