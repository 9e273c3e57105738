"""The engine-core process: the only process that imports JAX, owns the device and runs the Engine.

The launcher starts it once (`start_core`, multiprocessing "spawn", so no JAX, lock or thread
state is inherited) before gunicorn forks its HTTP workers. It applies `CoreSpec.env` (the
device selection, XLA flags) before anything is imported, listens on a Unix socket, then
builds the Engine with `CoreSpec.factory` (weights, KV pool, runner; tests pass a fake
runner) and starts it (warm-up runs on the engine thread). Workers connect with
engine/core_client.EngineClient; messages are engine/core_channel.py's.

Threads: the engine thread; one receiver per worker (Submit -> Engine.submit, whose
synchronous refusal or acceptance is queued for that worker before any event; Control ->
handle.cancel/stop_at); one sender that drains the outbox into one `Batch` per worker per
wake-up (the engine's handles and scheduling listener only enqueue there); the accept
thread; the builder; and the main thread, which waits for "stop" on the launcher's control
pipe, its EOF (the launcher died) or SIGTERM, then fails what is in flight
(Engine.shutdown), flushes the outbox and logs and exits without waiting for threads that
still work (a background compile). A worker that disconnects has its requests
cancelled. SIGINT is ignored: a terminal's Ctrl-C reaches the launcher, which stops us.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import logging.config
import multiprocessing
import multiprocessing.connection
import os
import secrets
import signal
import sys
import threading
from multiprocessing.connection import Listener
from typing import Callable

from ninfer_jax.engine.core_channel import (
    STATS_PUSH_S, Batch, Control, Hello, Relayed, Submit, SubmitReply, hang_up,
)
from ninfer_jax.engine.request import TERMINAL
from ninfer_jax.errors import ArtifactError, EngineUnavailable, InternalError, NinferError

CORE_SWITCH_INTERVAL_S = 0.0005

log = logging.getLogger("ninfer_jax.engine")

SHUTDOWN_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class CoreSpec:
    """What the core runs: `factory(*args)` returns an Engine, not started (the core adds
    its scheduling listener first). Module-level callable: it is pickled to the child."""

    factory: Callable
    args: tuple = ()
    env: dict = dataclasses.field(default_factory=dict)  # set before anything is imported
    logging: dict | None = None  # a logging.config.dictConfig for the core's stderr


class CoreProcess:
    """The launcher's handle on the running core: its address, key and stop()."""

    def __init__(self, process, control, address: str, authkey: bytes):
        self.process, self.control = process, control
        self.address, self.authkey = address, authkey
        self._owner_pid = os.getpid()

    def wait_listening(self, timeout: float = 120.0) -> None:
        """Until the core's socket accepts workers; RuntimeError if it exits first."""
        if not self.control.poll(timeout) or self.control.recv() != "listening":
            raise RuntimeError(f"the engine core did not start (exit code "
                               f"{self.process.exitcode})")

    def close_in_child(self) -> None:
        """In a forked HTTP worker: drop the inherited control end, so that only the
        launcher's exit closes it, and forget the core as a child: multiprocessing's exit
        handler would otherwise try to join it from the worker (not its parent)."""
        self.control.close()
        getattr(multiprocessing.process, "_children", set()).discard(self.process)

    def stop(self, timeout: float = SHUTDOWN_TIMEOUT_S + 5) -> None:
        if os.getpid() != self._owner_pid or self._exited(0):
            return  # a forked worker unwinding the launcher's stack, or already gone
        try:
            self.control.send("stop")
        except OSError:
            pass
        if not self._exited(timeout):
            log.warning("the engine core did not stop in %.0f s; killing it", timeout)
            self.process.kill()
        self.process.join(5)  # its exit code, unless gunicorn reaped it first

    def _exited(self, timeout: float) -> bool:
        """Whether the core has exited, waiting up to `timeout` s. Read from the process's
        sentinel, not is_alive(): gunicorn's master reaps every child on SIGCHLD, the core
        included, and multiprocessing then never learns its exit code (is_alive stays True)."""
        return bool(multiprocessing.connection.wait([self.process.sentinel], timeout))


def start_core(spec: CoreSpec, address: str) -> CoreProcess:
    context = multiprocessing.get_context("spawn")
    authkey = secrets.token_bytes(32)
    control, child_control = context.Pipe()
    process = context.Process(target=_core_main, name="ninfer-engine-core",
                              args=(spec, address, authkey, child_control))
    process.start()
    child_control.close()
    return CoreProcess(process, control, address, authkey)


def _core_main(spec: CoreSpec, address: str, authkey: bytes, control) -> None:
    os.environ.update(spec.env)
    # The engine thread waits on the device with the GIL released; when its step is done it
    # must get the GIL back at once, not after another thread's default 5 ms time slice.
    sys.setswitchinterval(CORE_SWITCH_INTERVAL_S)
    from ninfer_jax.engine.step_loop import GC_CLOCK  # not in the launcher: core only

    GC_CLOCK.install()  # slow step submits say how much of them the collector took
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if spec.logging:
        logging.config.dictConfig(spec.logging)
    server = CoreServer(Listener(address, family="AF_UNIX", authkey=authkey))
    control.send("listening")
    threading.Thread(target=server.build, args=(spec, stop), name="ninfer-core-build",
                     daemon=True).start()
    while not stop.is_set():
        try:
            if control.poll(0.2) and control.recv() == "stop":
                break
        except (EOFError, OSError):
            log.warning("the launcher went away; stopping the engine core")
            break
    server.shutdown()
    # What still runs now is disposable: a GPU runner's background compile of the remaining
    # step shapes (its stores are written atomically). A normal exit would join that pool
    # (concurrent.futures does at interpreter exit) and hold the core for minutes: run 36's
    # server was killed 15 s after every stop. Flush what we own, then leave at once.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def describe_runtime(engine=None) -> dict:
    """JAX's version, backend and devices, when the engine imported JAX (a fake does not),
    and the runner's device mesh (JaxRunner.mesh_description) when it has one."""
    jax = sys.modules.get("jax")
    if jax is None:
        return {}
    describe_mesh = getattr(getattr(engine, "runner", None), "mesh_description", None)
    try:
        return {"jax": jax.__version__, "backend": jax.default_backend(),
                "devices": [getattr(d, "device_kind", str(d)) for d in jax.devices()],
                **({"mesh": describe_mesh()} if describe_mesh is not None else {})}
    except Exception:  # noqa: BLE001 - describing the runtime must never stop start-up
        return {"jax": getattr(jax, "__version__", None)}


class _Worker:
    """One HTTP worker's connection and the handles of its requests (by the worker's key)."""

    def __init__(self, conn, number: int):
        self.conn, self.number = conn, number
        self.handles: dict = {}
        self.last_stats = None
        self.alive = True


class CoreServer:
    def __init__(self, listener: Listener):
        self.listener = listener
        self.engine = None
        self._hello: Hello | None = None
        self._lock = threading.Lock()  # workers, owners, handles maps, hello
        self._workers: list[_Worker] = []
        self._owners: dict[str, _Worker] = {}  # request id -> worker (scheduling events)
        self._cond = threading.Condition()
        self._outbox: dict = collections.defaultdict(list)  # guarded by _cond
        # (worker, item) queued without the lock (deque appends are atomic): the engine
        # thread's per-row events; moved into the outbox, in order, under the lock
        self._pending: collections.deque = collections.deque()
        self._stopping = False
        self._sender = threading.Thread(target=self._send_forever, name="ninfer-core-send",
                                        daemon=True)
        self._sender.start()
        threading.Thread(target=self._accept_forever, name="ninfer-core-accept",
                         daemon=True).start()

    def build(self, spec: CoreSpec, stop: threading.Event) -> None:
        try:
            engine = spec.factory(*spec.args)
            engine.add_scheduling_listener(self._on_scheduling)
            engine.round_listeners.append(self._flush)
            engine.start(freeze_heap=True)
        except (ArtifactError, NinferError, ValueError) as exc:
            # An expected start-up failure (a damaged artifact, an option the model refuses):
            # one line says it; a traceback is for bugs.
            log.error("cannot serve: the engine core could not build its engine: %s", exc)
            stop.set()
            return
        except BaseException:
            log.exception("the engine core could not build its engine")
            stop.set()
            return
        with self._lock:
            self.engine = engine
            self._hello = Hello(engine.config, engine.pool_tokens, describe_runtime(engine))
            for worker in self._workers:
                self._enqueue(worker, self._hello)

    # ------------------------------------------------------------------ workers

    def _accept_forever(self) -> None:
        number = 0
        while True:
            try:
                conn = self.listener.accept()
            except OSError:
                return  # listener closed (shutdown)
            except Exception:  # noqa: BLE001 - a failed handshake must not stop accepting
                log.warning("refused an engine-core connection", exc_info=True)
                continue
            worker = _Worker(conn, number)
            number += 1
            with self._lock:
                self._workers.append(worker)
                if self._hello is not None:
                    self._enqueue(worker, self._hello)
            threading.Thread(target=self._receive_forever, args=(worker,),
                             name=f"ninfer-core-recv-{worker.number}", daemon=True).start()

    def _receive_forever(self, worker: _Worker) -> None:
        try:
            while True:
                message = worker.conn.recv()
                if isinstance(message, Submit):
                    self._submit(worker, message)
                elif isinstance(message, Control):
                    self._control(worker, message)
        except (EOFError, OSError):
            pass
        finally:
            self._drop(worker)

    def _submit(self, worker: _Worker, message: Submit) -> None:
        engine = self.engine
        try:
            if engine is None:
                raise EngineUnavailable("the engine is still loading")
            handle = engine.submit(message.request)
        except NinferError as error:
            self._enqueue(worker, SubmitReply(message.key, error))
            return
        except Exception as exc:  # noqa: BLE001 - the worker must get an answer
            log.exception("submit failed in the engine core")
            self._enqueue(worker, SubmitReply(message.key, InternalError(str(exc))))
            return
        with self._lock:
            worker.handles[message.key] = handle
            self._owners[message.request.request_id] = worker
        # The reply is queued before the first event, which forward() may relay at once.
        self._enqueue(worker, SubmitReply(message.key, None))
        handle.forward(functools.partial(self._relay, worker, message.key))

    def _control(self, worker: _Worker, message: Control) -> None:
        handle = worker.handles.get(message.key)
        if handle is None:
            return  # already terminal
        if message.stop_at is not None:
            handle.stop_at(message.stop_at)
        if message.cancel:
            handle.cancel()

    def _drop(self, worker: _Worker) -> None:
        """A worker went away: nobody will read its requests, so they stop."""
        worker.alive = False
        with self._lock:
            if worker in self._workers:
                self._workers.remove(worker)
            handles = list(worker.handles.values())
        for handle in handles:
            handle.cancel()
        worker.conn.close()

    # ------------------------------------------------------------------ engine thread

    def _relay(self, worker: _Worker, key: int, handle, event) -> None:
        outcome = None
        if isinstance(event, TERMINAL):
            policy = handle.request.token_policy
            outcome = policy.outcome() if hasattr(policy, "outcome") else None
            with self._lock:
                worker.handles.pop(key, None)
                if self._owners.get(handle.request.request_id) is worker:
                    del self._owners[handle.request.request_id]
        self._enqueue(worker, Relayed(key, event, outcome), wake=False)

    def _on_scheduling(self, event) -> None:
        worker = self._owners.get(event.request_id)  # one dict read: no waiting here
        if worker is not None:
            self._enqueue(worker, event, wake=False)

    # ------------------------------------------------------------------ sender

    def _enqueue(self, worker: _Worker, item, wake: bool = True) -> None:
        """Queue an item for a worker. The engine thread's items (events, scheduling
        events) wait for the end of its round (`_flush`), so each round reaches a worker
        as one message and the sender thread wakes once per round, not once per token:
        every wake-up takes the GIL from the engine thread. They skip the lock too (one
        per row per step otherwise)."""
        if not wake:
            self._pending.append((worker, item))
            return
        with self._cond:
            self._take_pending()  # what was queued before this item goes first
            self._outbox[worker].append(item)
            self._cond.notify()

    def _take_pending(self) -> None:
        """Move the lock-free queue into the outbox (with _cond held)."""
        pending = self._pending
        while pending:
            worker, item = pending.popleft()
            self._outbox[worker].append(item)

    def _flush(self) -> None:
        """End of an engine round: send what it queued."""
        with self._cond:
            self._take_pending()
            if self._outbox:
                self._cond.notify()

    def _send_forever(self) -> None:
        while True:
            with self._cond:
                self._take_pending()
                if not self._outbox and not self._stopping:
                    self._cond.wait(STATS_PUSH_S)
                    self._take_pending()  # e.g. Failed events published after the last round
                outbox, self._outbox = self._outbox, collections.defaultdict(list)
                stopping = self._stopping
            engine = self.engine
            stats = engine.stats() if engine is not None else None
            with self._lock:
                workers = list(self._workers)
            for worker in workers:
                items = outbox.pop(worker, None)
                if items or (stats is not None and stats is not worker.last_stats):
                    self._send(worker, Batch(items or [], stats))
            if stopping:
                return

    def _send(self, worker: _Worker, batch: Batch) -> None:
        try:
            worker.conn.send(batch)
            worker.last_stats = batch.stats
        except (OSError, ValueError):
            pass  # the worker is gone; its receiver drops it

    # ------------------------------------------------------------------ main thread

    def shutdown(self) -> None:
        self.listener.close()
        engine = self.engine
        if engine is not None:
            log.info("engine core: shutting down the engine")
            engine.shutdown(timeout=SHUTDOWN_TIMEOUT_S)  # in-flight requests get Failed
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._sender.join(5)  # the last batch carries those Failed events
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            hang_up(worker.conn)
