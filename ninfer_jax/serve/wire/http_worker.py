"""The HTTP worker class: gunicorn's gthread worker, made safe against clients that stall.

gthread hands a connection to an HTTP thread as soon as its first bytes arrive, and the
thread then blocks reading the rest of the request head; a few dozen sockets that send half
a head and stop would hold every thread (even /health would stop answering). Here the
worker's event loop reads each request head itself, without blocking, and a thread gets the
connection only once the whole head is in (or the head is refused):

- a head must arrive within `header_timeout_s` of the connection (or of the previous reply
  on a kept-alive one): 408, connection closed; a head over MAX_HEAD_BYTES is 431;
- in the thread the socket has a `read_timeout_s` timeout, so a body that stalls ends in a
  408 (serve/wire/json_body.py) and a client that stops reading its reply is cut off, logged in
  one line, not with a traceback;
- at most `max_connections` connections per worker are open, whatever the thread count;
  past it the worker stops accepting, and new clients wait in the listen backlog.

Stopping (SIGTERM, and SIGINT too, which gunicorn treats as "quit now"): the worker closes
its listening sockets (new clients are refused, not parked), lets in-flight requests run for
`shutdown_timeout_s`, then asks the application to end the rest (`abort_in_flight`, see
serve/wire/shutdown.py) and exits once their threads are done.

Threading: the head buffers belong to the event-loop thread; a connection is in exactly one
of gthread's places at a time (heading here, a thread, kept alive, closed).
"""
from __future__ import annotations

import dataclasses
import errno
import io
import selectors
import time
from functools import partial

import signal

from gunicorn.arbiter import Arbiter
from gunicorn.workers.gthread import TConn, ThreadWorker

MAX_HEAD_BYTES = 64 * 1024
_RECV_BYTES = 64 * 1024
# While stopping, a connection still sending its head gets this long to finish it.
_STOP_HEAD_LINGER_S = 2.0
_HEAD_END = b"\r\n\r\n"
_REFUSALS = {
    408: b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n"
         b"Content-Length: 0\r\n\r\n",
}
# A client that stopped reading (socket timeout, TCP user timeout) or went away mid-reply.
_CUT_OFF_ERRNOS = (errno.ETIMEDOUT, errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN)


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """The server's --header-timeout, --read-timeout, --max-connections and
    --shutdown-timeout (declared once, in serve/config.py)."""
    header_timeout_s: float
    read_timeout_s: float
    max_connections: int
    shutdown_timeout_s: float


class _Conn(TConn):
    def __init__(self, cfg, sock, client, server, read_timeout_s: float):
        super().__init__(cfg, sock, client, server)
        self.read_timeout_s = read_timeout_s
        self.head = bytearray()
        self.head_deadline = 0.0

    def init(self) -> None:
        # Runs in the HTTP thread before each request on this connection.
        super().init()
        if self.head:
            self.parser.unreader.unread(bytes(self.head))
            self.head = bytearray()
        self.sock.settimeout(self.read_timeout_s)


class GuardedThreadWorker(ThreadWorker):
    limits: ConnectionLimits  # set per server by `worker_class`

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.heading: dict[_Conn, None] = {}  # insertion order is deadline order
        self._abort_at: float | None = None  # set when stopping begins
        self._aborted = False

    def init_signals(self) -> None:
        super().init_signals()
        # gunicorn quits at once on SIGINT; a Ctrl-C (sent to the whole process group) must
        # drain like SIGTERM.
        signal.signal(signal.SIGINT, self.handle_exit)
        # gunicorn leaves SIGHUP at its default in workers, which kills them mid-stream when a
        # terminal hangs up on the process group; the master decides what SIGHUP means.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def set_accept_enabled(self, enabled: bool) -> None:
        super().set_accept_enabled(enabled)
        if enabled or self.alive or self._abort_at is not None:
            return
        # Stopping: the master closed its copies, so closing ours makes connects fail fast.
        for listener in self.sockets:
            listener.close()
        self._abort_at = time.monotonic() + self.limits.shutdown_timeout_s
        self.log.info("stopping: in-flight requests have %.0f s to finish",
                      self.limits.shutdown_timeout_s)

    def accept(self, listener) -> None:
        if self.cfg.is_ssl:
            return super().accept(listener)  # TLS heads cannot be read before the handshake
        try:
            client_sock, client_addr = listener.accept()
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                return
            raise
        self.nr_conns += 1
        conn = _Conn(self.cfg, client_sock, client_addr, listener.getsockname(),
                     self.limits.read_timeout_s)
        self._await_head(conn)

    def on_client_socket_readable(self, conn, client) -> None:
        # A kept-alive connection starts its next request: its head is read here too.
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        if not isinstance(conn, _Conn):
            return self.enqueue_req(conn)
        self._await_head(conn)

    def _await_head(self, conn: _Conn) -> None:
        conn.sock.setblocking(False)
        conn.head_deadline = time.monotonic() + self.limits.header_timeout_s
        if not self.alive:
            conn.head_deadline = min(conn.head_deadline, time.monotonic() + _STOP_HEAD_LINGER_S)
        self.heading[conn] = None
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_head_bytes, conn))

    def _on_head_bytes(self, conn: _Conn, _sock) -> None:
        try:
            data = conn.sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            return self._close_heading(conn)
        searched_from = max(len(conn.head) - len(_HEAD_END) + 1, 0)
        conn.head += data
        if conn.head.find(_HEAD_END, searched_from) >= 0:
            self._leave_heading(conn)
            conn.data_ready = True
            self.enqueue_req(conn)
        elif len(conn.head) > MAX_HEAD_BYTES:
            self._close_heading(conn, refusal=431)

    def _leave_heading(self, conn: _Conn) -> None:
        del self.heading[conn]
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass

    def _close_heading(self, conn: _Conn, refusal: int | None = None) -> None:
        self._leave_heading(conn)
        if refusal is not None:
            try:
                conn.sock.send(_REFUSALS[refusal])
            except OSError:
                pass
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        # Called on every turn of gthread's loop, the stopping loop included.
        super().murder_pending()
        now = time.monotonic()
        if self._abort_at is not None and now >= self._abort_at and not self._aborted:
            self._aborted = True
            abort = getattr(self.app, "abort_in_flight", None)
            count = abort() if abort is not None else 0
            self.log.info("stopping: --shutdown-timeout passed; %d request(s) ended", count)
        for conn in list(self.heading):
            deadline = conn.head_deadline
            if not self.alive:
                # Stopping: an idle connection goes at once, one mid-head gets a moment.
                deadline = min(deadline, now if not conn.head else now + _STOP_HEAD_LINGER_S)
                conn.head_deadline = deadline
            if deadline > now:
                if self.alive:
                    break
                continue
            self._close_heading(conn, refusal=408 if conn.head else None)

    def finish_request(self, conn, fs) -> None:
        # A client may pipeline its next request behind this one; gthread hands a read-ahead
        # straight back to a thread, which would then block on a partial head.
        if (isinstance(conn, _Conn) and self.alive and not fs.cancelled()
                and fs.exception() is None and fs.result() is True):
            buffered = conn.parser.unreader.buf.getvalue()
            if buffered and _HEAD_END not in buffered:
                conn.parser.unreader.buf = io.BytesIO()
                conn.head = bytearray(buffered)
                return self._await_head(conn)
        super().finish_request(conn, fs)

    def handle_request(self, req, conn):
        try:
            return super().handle_request(req, conn)
        except OSError as exc:
            if not (isinstance(exc, TimeoutError) or exc.errno in _CUT_OFF_ERRNOS):
                raise
            # The reply iterator was closed on the way out (the request is cancelled).
            self.log.info("a client stopped reading its reply; connection closed (%s)",
                          "timeout" if exc.errno is None else errno.errorcode.get(exc.errno))
            return False


class GracefulArbiter(Arbiter):
    """gunicorn's master, with SIGINT stopping as gracefully as SIGTERM and SIGHUP ignored."""

    def handle_int(self):
        raise StopIteration

    def handle_hup(self):
        # gunicorn's reload would replace the workers, cutting their streams, and there is no
        # configuration to re-read: the options are fixed at start.
        self.log.info("SIGHUP ignored: restart the server to change its options")


def worker_class(limits: ConnectionLimits) -> type:
    """The worker class gunicorn forks for one server, carrying its limits."""
    return type("NinferThreadWorker", (GuardedThreadWorker,), {"limits": limits})
