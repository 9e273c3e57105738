"""Noticing a client that went away while its request waits, without writing to it.

A stream notices a closed client when a write fails, but a request that waits for admission,
or a non-streaming request waiting for its whole reply, writes nothing until the end. For
those waits `PeerWatch` looks at the client socket itself: gunicorn's workers put it in the
WSGI environ as `gunicorn.socket`. The socket is readable and a non-blocking one-byte
MSG_PEEK returns b"" only at end of file, i.e. after the client closed (or half-closed) its
side; a reset reads as an error. Bytes waiting there (a pipelined next request) mean the
client is still around, and peeking leaves them for the server to read.

Where there is no plain socket (Falcon's TestClient, a TLS-wrapped socket, whose records
cannot be peeked without decrypting) the watch is `NO_PEER`, which never reports a close,
so waits behave exactly as before. Callers poll `is_closed()` every `POLL_S` seconds.
A client that half-closes after sending its request but still reads the reply is treated
as gone; HTTP clients do not do that.
"""
from __future__ import annotations

import select
import socket
import ssl
import time

# How often a waiting HTTP thread looks at its client socket (one select + one peek).
POLL_S = 0.2
_PEEK_FLAGS = socket.MSG_PEEK | getattr(socket, "MSG_DONTWAIT", 0)


class ClientGone(Exception):
    """The client closed its connection before its reply started; the request was cancelled.

    Raised on an HTTP thread only; serve/core/errors.py answers it with an empty 499 that no one
    reads (the connection is closed), logged at info level rather than as a failure."""


class PeerWatch:
    """One request's client connection, observed without reading or writing application data."""

    def __init__(self, sock: socket.socket | None):
        self._sock = sock
        self._closed = False
        self._next_check = 0.0

    @classmethod
    def from_environ(cls, environ) -> "PeerWatch":
        sock = environ.get("gunicorn.socket")
        if not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket):
            return NO_PEER
        return cls(sock)

    @property
    def is_watching(self) -> bool:
        return self._sock is not None

    def is_closed(self) -> bool:
        """True once the client has closed its side of the connection (sticky)."""
        if self._closed or self._sock is None:
            return self._closed
        try:
            # poll, not select: select() refuses descriptors from 1024 on (ValueError), which
            # would read as a closed client on a busy server.
            poller = select.poll()
            poller.register(self._sock, select.POLLIN)
            if poller.poll(0):
                self._closed = self._sock.recv(1, _PEEK_FLAGS) == b""
        except (BlockingIOError, InterruptedError):
            pass  # readable a moment ago, nothing to read now: still connected
        except (OSError, ValueError):
            self._closed = True  # reset by the peer, or the server already closed the socket
        return self._closed

    def due(self, now: float | None = None) -> bool:
        """Rate limit for loops that wake often (token events): True at most every POLL_S."""
        if self._sock is None:
            return False
        now = time.monotonic() if now is None else now
        if now < self._next_check:
            return False
        self._next_check = now + POLL_S
        return True


NO_PEER = PeerWatch(None)


def peer_of(req) -> PeerWatch:
    """The watch for a Falcon request (NO_PEER when the server gives no socket)."""
    return PeerWatch.from_environ(req.env)
