"""The listener's guards against idle and half-sent connections (engine/server/http.py): a
deadline for the request head, none for bodies or streamed answers, and a cap on open
connections. Raw sockets, because an HTTP client always sends whole requests."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from engine.server import ServerOptions, ServerState
from engine.server.http import listen
from engine.server.testing import FakeChatTemplate, make_fake_scheduler

HEAD_TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def state():
    sched = make_fake_scheduler(n_slots=2, n_ctx=256)
    s = ServerState(ServerOptions())
    s.set_ready(sched, FakeChatTemplate())
    yield s
    sched.stop()


@pytest.fixture
def handle(state):
    h = listen(state, "127.0.0.1", 0, head_timeout_s=HEAD_TIMEOUT_S, max_connections=4)
    yield h
    h.stop()


def _connect(handle) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", handle.port), timeout=5)
    return sock


def _read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    t0 = time.monotonic()
    chunks = []
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks), time.monotonic() - t0


def test_half_sent_head_is_answered_408_and_closed(handle):
    with _connect(handle) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        data, waited = _read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 ")
    assert b'"code":408' in data and b"request head" in data
    assert waited < HEAD_TIMEOUT_S + 3


def test_trickled_head_is_closed_at_the_deadline(handle):
    # a byte every 0.1 s keeps data arriving, but the whole head is still late
    with _connect(handle) as sock:
        t0 = time.monotonic()
        sock.settimeout(0.1)
        closed = False
        for byte in (
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Trickle: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        ):
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(65536)[:12] in (b"", b"HTTP/1.1 408"):
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
        assert closed and time.monotonic() - t0 < HEAD_TIMEOUT_S + 3


def test_silent_connection_is_closed(handle):
    with _connect(handle) as sock:
        data, waited = _read_until_closed(sock)
    assert data == b"" and waited < HEAD_TIMEOUT_S + 3


def test_slow_body_after_a_complete_head_is_not_cut(handle):
    body = b'{"content": "ab"}'
    with _connect(handle) as sock:
        sock.sendall(
            b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body[:5]
        )
        time.sleep(HEAD_TIMEOUT_S * 3)  # the body is read under its own (long) limit
        sock.sendall(body[5:])
        data, _ = _read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b'{"tokens":[100,101]}')


def _read_health(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b'{"status":"ok"}'):
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def test_keep_alive_connection_serves_a_later_request(handle):
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with _connect(handle) as sock:
        sock.sendall(request)
        assert _read_health(sock).startswith(b"HTTP/1.1 200 ")
        time.sleep(HEAD_TIMEOUT_S * 2)  # idle between requests: the keep-alive timeout's business
        sock.sendall(request[:10])
        time.sleep(HEAD_TIMEOUT_S / 5)  # the deadline counts from the first byte, not the response
        sock.sendall(request[10:])
        assert _read_health(sock).startswith(b"HTTP/1.1 200 ")


def test_streamed_answer_outlives_the_head_timeout(state):
    h = listen(state, "127.0.0.1", 0, head_timeout_s=0.05)
    try:
        body = {"prompt": "a", "n_predict": 40, "stream": True}
        with httpx.stream("POST", h.url + "/completion", json=body, timeout=30) as r:
            assert r.status_code == 200
            events = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    time.sleep(0.005)  # a slow reader: the stream lasts many head timeouts
        assert len(events) >= 40 and '"stop":true' in events[-1]
    finally:
        h.stop()


def test_connections_over_the_cap_get_503(handle):
    idle = [_connect(handle) for _ in range(4)]
    try:
        time.sleep(0.1)
        with _connect(handle) as extra:
            data, _ = _read_until_closed(extra)
        assert data.startswith(b"HTTP/1.1 503 ") and b"too many open connections" in data
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.1)
    assert httpx.get(handle.url + "/health", timeout=5).status_code == 200  # room again
