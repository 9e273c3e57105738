"""PeerWatch: a closed client connection is seen by peeking, never by consuming its bytes."""
import os
import socket

import pytest

from ninfer_jax.serve.wire.disconnect import NO_PEER, POLL_S, PeerWatch


def test_open_connection_is_not_closed():
    server_end, client_end = socket.socketpair()
    with server_end, client_end:
        assert not PeerWatch(server_end).is_closed()


def test_pipelined_bytes_are_left_in_place():
    server_end, client_end = socket.socketpair()
    with server_end, client_end:
        client_end.sendall(b"GET /next HTTP/1.1\r\n")
        watch = PeerWatch(server_end)
        assert not watch.is_closed()
        assert server_end.recv(64) == b"GET /next HTTP/1.1\r\n"


def test_closed_connection_is_seen_and_stays_seen():
    server_end, client_end = socket.socketpair()
    with server_end:
        client_end.close()
        watch = PeerWatch(server_end)
        assert watch.is_closed()
        assert watch.is_closed()


def test_data_then_close_counts_as_open_until_the_data_is_read():
    # Bytes ahead of the end of file belong to the server's parser; peeking sees them first.
    server_end, client_end = socket.socketpair()
    with server_end:
        client_end.sendall(b"x")
        client_end.close()
        assert not PeerWatch(server_end).is_closed()
        server_end.recv(1)
        assert PeerWatch(server_end).is_closed()


def test_socket_already_closed_by_the_server_counts_as_gone():
    server_end, client_end = socket.socketpair()
    with client_end:
        watch = PeerWatch(server_end)
        server_end.close()
        assert watch.is_closed()


def test_without_a_plain_socket_there_is_no_watch():
    assert PeerWatch.from_environ({}) is NO_PEER
    assert PeerWatch.from_environ({"gunicorn.socket": object()}) is NO_PEER
    assert not NO_PEER.is_watching and not NO_PEER.is_closed() and not NO_PEER.due()
    server_end, client_end = socket.socketpair()
    with server_end, client_end:
        assert PeerWatch.from_environ({"gunicorn.socket": server_end}).is_watching


def test_due_rate_limits_the_checks():
    server_end, client_end = socket.socketpair()
    with server_end, client_end:
        watch = PeerWatch(server_end)
        assert watch.due(100.0)
        assert not watch.due(100.0 + POLL_S / 2)
        assert watch.due(100.0 + POLL_S)


def test_descriptors_past_1024_are_watched():
    # select() cannot take descriptors from 1024 on; a busy server has them.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1600:
        pytest.skip("the descriptor limit is below 1600")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1600), hard))
    server, client = socket.socketpair()
    os.dup2(server.fileno(), 1500)
    high = socket.socket(fileno=1500)
    try:
        watch = PeerWatch(high)
        assert not watch.is_closed()
        client.close()
        assert watch.is_closed()
    finally:
        high.close()
        server.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
