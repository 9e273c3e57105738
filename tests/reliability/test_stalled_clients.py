"""Clients that stall cannot starve the others (serve/http_worker.py): request heads are read
by the worker's event loop under a header timeout, bodies under a read timeout, and
connections are capped apart from the HTTP threads (--max-connections: past it new clients
wait in the listen backlog); a client that stops reading its reply is cut off after the read
timeout, logged in one line."""
import json
import socket
import time

import httpx
import pytest

CHAT = {"model": "smollm2-135m-instruct", "max_tokens": 3,
        "messages": [{"role": "user", "content": "SCRIPT:ok"}]}


@pytest.fixture(scope="module")
def server(fake_server):
    # max_context: room for a reply long enough to fill the socket buffers of a client that
    # stops reading (a "ramble" script never ends).
    return fake_server(http_threads=4, header_timeout_s=2, read_timeout_s=1,
                       max_context=4096, scripts={"ok": "fine", "ramble": " la"})


def recv_until(sock, marker: bytes) -> bytes:
    answer = b""
    while marker not in answer:
        piece = sock.recv(4096)
        assert piece, answer
        answer += piece
    return answer


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def test_stalled_heads_do_not_stop_health(server):
    stalled = []
    try:
        for _ in range(32):  # eight times the thread count
            sock = connect(server)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            stalled.append(sock)
        time.sleep(0.3)
        started = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        reply = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=10)
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
        assert time.monotonic() - started < 3
    finally:
        for sock in stalled:
            sock.close()


def test_a_head_that_never_ends_is_408_after_the_header_timeout(server):
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408")
        assert 1 < time.monotonic() - started < 5
    with connect(server) as idle:  # nothing sent at all: closed without a word
        assert idle.recv(4096) == b""


def test_a_stalled_body_is_408_and_frees_its_thread(server):
    with connect(server) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"mo")
        answer = b""
        while b"request_timeout" not in answer:
            piece = sock.recv(4096)
            assert piece, answer
            answer += piece
        assert answer.startswith(b"HTTP/1.1 408"), answer
    assert httpx.post(server.url + "/v1/chat/completions", json=CHAT).status_code == 200


def test_a_chunked_body_is_served(server):

    def pieces():
        body = json.dumps(CHAT).encode()
        yield body[:10]
        yield body[10:]

    reply = httpx.post(server.url + "/v1/chat/completions", content=pieces(),
                       headers={"Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "fine"


def test_a_pipelined_partial_head_holds_no_thread(server):
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    stalled = []
    try:
        for _ in range(6):  # more than the server's 4 threads
            sock = connect(server)
            sock.sendall(request + b"GET /health HTTP/1.1\r\nHo")
            assert recv_until(sock, b'"status": "ok"').startswith(b"HTTP/1.1 200")
            stalled.append(sock)
        assert httpx.get(server.url + "/health", timeout=3).status_code == 200
        assert stalled[0].recv(4096).startswith(b"HTTP/1.1 408")  # after --header-timeout
    finally:
        for sock in stalled:
            sock.close()


def test_a_huge_head_is_431(server):
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Junk: " + b"a" * 70000)
        assert sock.recv(4096).startswith(b"HTTP/1.1 431")


def test_past_max_connections_a_client_waits_until_one_closes(fake_server):
    # The head timeout is long, so the idle connections stay open for the whole test.
    capped = fake_server(http_threads=2, max_connections=3, header_timeout_s=30)
    idle = [socket.create_connection(("127.0.0.1", capped.port), timeout=10) for _ in range(3)]
    try:
        time.sleep(0.5)  # the worker accepts all three, then stops accepting
        with socket.create_connection(("127.0.0.1", capped.port), timeout=10) as parked:
            parked.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            parked.settimeout(1.5)
            with pytest.raises(TimeoutError):  # in the listen backlog: no answer
                parked.recv(4096)
            with pytest.raises(httpx.TimeoutException):
                httpx.get(capped.url + "/health", timeout=1)
            for sock in idle:
                sock.close()
            started = time.monotonic()
            parked.settimeout(5)
            assert recv_until(parked, b'"status": "ok"').startswith(b"HTTP/1.1 200")
            assert time.monotonic() - started < 2
        assert httpx.get(capped.url + "/health", timeout=3).status_code == 200
    finally:
        for sock in idle:
            sock.close()


def test_a_client_that_stops_reading_is_cut_off_in_one_log_line(server):
    body = json.dumps({**CHAT, "max_tokens": 4000, "stream": True,
                       "messages": [{"role": "user", "content": "SCRIPT:ramble"}]}).encode()
    before = server.stderr_text()
    with socket.socket() as sock:
        # A small receive window and segments, so the reply soon fills the server's buffers.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                     + body)
        head = sock.recv(600)
        assert head.startswith(b"HTTP/1.1 200"), head  # then it reads nothing more

        def cut_off():
            return "a client stopped reading its reply" in server.stderr_text()[len(before):]

        deadline = time.monotonic() + 15
        while not cut_off() and time.monotonic() < deadline:
            time.sleep(0.2)
        log = server.stderr_text()[len(before):]
        assert cut_off(), log[-3000:]
    assert "a client stopped reading its reply; connection closed (timeout)" in log
    assert "Traceback" not in log, log[-3000:]
    assert httpx.get(server.url + "/health", timeout=3).status_code == 200
