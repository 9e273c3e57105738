"""Clients that stall cannot starve the others (serve/http_worker.py): request heads are read
by the worker's event loop under a header timeout, bodies under a read timeout, and
connections are capped apart from the HTTP threads."""
import json
import socket
import time

import httpx
import pytest

CHAT = {"model": "smollm2-135m-instruct", "max_tokens": 3,
        "messages": [{"role": "user", "content": "SCRIPT:ok"}]}


@pytest.fixture(scope="module")
def server(fake_server):
    return fake_server(http_threads=4, header_timeout_s=2, read_timeout_s=1,
                       scripts={"ok": "fine"})


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
