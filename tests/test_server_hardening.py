"""Hostile requests (issue 14): each gets a 4xx in the OpenAI error shape, never a 5xx, and
the keep-alive connection it came on stays usable; the router answers the same way and ends
a stream whose child died with an error event instead of a broken chunked body."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine.router.proxy import create_router_app
from engine.router.supervisor import ChildServer, Router
from engine.server import ServerOptions, ServerState, listen, start_server
from engine.server.testing import N_VOCAB, FakeChatTemplate, make_fake_scheduler

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture(scope="module")
def server():
    sched = make_fake_scheduler(n_slots=2, n_ctx=512)
    handle = start_server(
        sched,
        port=0,
        chat_template=FakeChatTemplate(),
        options=ServerOptions(embeddings=True, n_predict=8),
    )
    yield handle
    handle.stop()
    sched.stop()


class Conn:
    """One keep-alive connection, so a test sees whether the server dropped it."""

    def __init__(self, port: int, headers: dict[str, str] | None = None):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.headers = headers or {}

    def post(self, path: str, body: bytes | dict, content_type: str = "application/json"):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.c.request("POST", path, raw, {"Content-Type": content_type, **self.headers})
        r = self.c.getresponse()
        return r.status, r.read()

    def get(self, path: str):
        self.c.request("GET", path, headers=self.headers)
        r = self.c.getresponse()
        return r.status, r.read()

    def close(self):
        self.c.close()


@pytest.fixture
def conn(server):
    c = Conn(server.port)
    yield c
    c.close()


def error_of(status: int, raw: bytes) -> dict:
    assert status < 500, raw
    err = json.loads(raw)["error"]
    assert set(err) >= {"code", "message", "type"} and err["code"] == status
    return err


def assert_alive(conn: Conn) -> None:
    status, raw = conn.post("/v1/chat/completions", CHAT)
    assert status == 200, raw


# -- JSON parsing: depth, surrogates, numbers --------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/completion", "/tokenize", "/apply-template"]
)
def test_deeply_nested_body_is_a_400_and_keeps_the_connection(conn, path):
    status, raw = conn.post(path, DEEP)
    assert status == 400 and "nest" in error_of(status, raw)["message"]
    assert_alive(conn)


@pytest.mark.parametrize("field", ["metadata", "chat_template_kwargs", "tools", "logit_bias"])
def test_deep_value_inside_a_valid_body_is_a_400(conn, field):
    deep: object = 1
    for _ in range(600):
        deep = [deep]
    status, raw = conn.post("/v1/chat/completions", {**CHAT, field: {"a": deep}})
    assert status == 400 and "nest" in error_of(status, raw)["message"]


def test_nesting_under_the_limit_is_served(conn):
    deep: object = "x"
    for _ in range(300):
        deep = {"a": deep}
    status, raw = conn.post(
        "/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"extra": deep}}
    )
    assert status == 200, raw
    parts = [{"type": "text", "text": "hi", "meta": deep}]
    status, raw = conn.post("/apply-template", {"messages": [{"role": "user", "content": parts}]})
    assert status == 200, raw


LONE = '"\\ud800"'


@pytest.mark.parametrize(
    "path, template",
    [
        ("/v1/chat/completions", '{"model": %s, "messages": [{"role": "user", "content": "hi"}]}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": %s}]}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "stop": [%s]}'),
        ("/v1/completions", '{"prompt": %s, "max_tokens": 1}'),
        ("/completion", '{"prompt": "a", "stop": %s, "n_predict": 1}'),
        ("/apply-template", '{"messages": [{"role": %s, "content": "x"}]}'),
        ("/tokenize", '{"content": %s, "with_pieces": true}'),
        ("/tokenize", '{%s: 1, "content": "a"}'),
        ("/v1/embeddings", '{"input": %s, "model": "m"}'),
    ],
)
def test_lone_surrogate_is_a_400_wherever_it_is(conn, path, template):
    for lone in (LONE, '"\\udc00"', '"a\\ud800b"', '"\\ud800\\u0041"'):
        status, raw = conn.post(path, (template % lone).encode())
        assert status == 400 and "surrogate" in error_of(status, raw)["message"]
    assert_alive(conn)


def test_surrogate_pair_and_escaped_backslash_are_fine(conn):
    status, raw = conn.post(
        "/tokenize", b'{"content": "\\ud83d\\ude00 \\\\ud800", "with_pieces": true}'
    )
    assert status == 200, raw


@pytest.mark.parametrize(
    "body",
    [
        b'{"prompt": "a", "temperature": 1e999}',
        b'{"prompt": "a", "logit_bias": {"5": 1e999}}',
        b'{"prompt": "a", "logit_bias": [[5, -1e999]]}',
        b'{"prompt": "a", "dynatemp_range": -1e400}',
        b'{"prompt": "a", "metadata": {"x": 1e999}}',
        b'{"prompt": "a", "temperature": NaN}',
        b'{"prompt": "a", "top_p": -Infinity}',
    ],
)
def test_numbers_json_cannot_hold_are_a_400(conn, body):
    status, raw = conn.post("/completion", body)
    assert status == 400, raw
    error_of(status, raw)


# -- request fields that used to reach a 500 ---------------------------------------------------


def test_logit_bias_banning_every_token_still_generates(conn):
    # llama.cpp's sampler chain never runs out of candidates (logit bias only lowers them to
    # -inf) and its dist sampler then falls back to a token; here the model's own choice.
    for greedy in (True, False):
        body = {
            "prompt": "ab",
            "n_predict": 3,
            "temperature": 0 if greedy else 0.8,
            "logit_bias": [[t, False] for t in range(N_VOCAB)],
        }
        status, raw = conn.post("/completion", body)
        assert status == 200, raw
        assert json.loads(raw)["content"] == "cde"


@pytest.mark.parametrize(
    "bias",
    [
        [[None, 1]],
        [[[1], 1]],
        [[{"a": 1}, 1]],
        [[True, 1]],
        [[1.5, 1]],
        [[1, "x"]],
        [[1, None]],
        [[1, 10**400]],
        [1],
        ["ab"],
        [[1, 2, 3]],
    ],
)
def test_malformed_logit_bias_is_a_400(conn, bias):
    status, raw = conn.post("/completion", {"prompt": "a", "n_predict": 1, "logit_bias": bias})
    assert status == 400 and "logit_bias" in error_of(status, raw)["message"]


@pytest.mark.parametrize(
    "key, value",
    [
        ("messages", []),
        ("messages", 5),
        ("add_generation_prompt", "yes"),
        ("add_generation_prompt", True),
        ("tools", 3),
        ("bos_token", "x"),
        ("eos_token", 1),
    ],
)
def test_reserved_chat_template_kwargs_are_a_400_naming_the_key(conn, key, value):
    for path in ("/v1/chat/completions", "/apply-template"):
        status, raw = conn.post(
            path, {"messages": CHAT["messages"], "chat_template_kwargs": {key: value}}
        )
        assert status == 400 and repr(key) in error_of(status, raw)["message"]


# -- transport ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, ctype",
    [
        (b"", "application/json"),
        (b"   ", "application/json"),
        (b"\xff\xfe{}", "application/json"),
        (b'{"prompt": "a"', "application/json"),
        (b"prompt=a", "application/x-www-form-urlencoded"),
        (b"\x00" * 10, "application/octet-stream"),
        (b"[]", "text/plain"),
        (b"null", "application/json"),
        (b'"\\ud800"', "application/json"),
        (b'{"prompt": "\xed\xa0\x80"}', "application/json"),
    ],
)
def test_garbage_bodies_are_a_400_and_keep_the_connection(conn, body, ctype):
    status, raw = conn.post("/completion", body, ctype)
    assert status == 400, raw
    error_of(status, raw)
    assert_alive(conn)


def test_an_unexpected_error_is_a_json_500_and_keeps_the_connection(server, conn, monkeypatch):
    def boom():
        raise RuntimeError("bug")

    monkeypatch.setattr(server.state.scheduler, "slots_info", boom)
    status, raw = conn.get("/slots")
    assert status == 500 and "RuntimeError" in json.loads(raw)["error"]["message"]
    assert_alive(conn)


# -- OpenAPI -----------------------------------------------------------------------------------


def _refs(node, out: list[str]) -> list[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            out.append(node["$ref"])
        for v in node.values():
            _refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out)
    return out


def _resolve(spec: dict, ref: str):
    assert ref.startswith("#/"), ref
    node = spec
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def test_openapi_refs_all_resolve(conn):
    status, raw = conn.get("/openapi.json")
    assert status == 200
    spec = json.loads(raw)
    refs = _refs(spec, [])
    assert refs
    for ref in refs:
        _resolve(spec, ref)
    chat = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]
    assert "messages" in _resolve(spec, chat["$ref"])["properties"]


# -- router ------------------------------------------------------------------------------------


class DyingChild:
    """A stand-in child server that dies half-way through every answer: a stream stops after
    one event and a half, a plain answer after its headers."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                self._answer(c)

    def _answer(self, c: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += c.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        length = next(
            int(line.split(b":")[1])
            for line in head.lower().split(b"\r\n")
            if line.startswith(b"content-length")
        )
        while len(body) < length:
            body += c.recv(65536)
        if json.loads(body).get("stream"):
            event = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
            c.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                + b"%x\r\n%s\r\n" % (len(event), event)
                + b'8\r\ndata: {"\r\n'
            )
        else:
            c.sendall(
                b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"ch'
            )
        c.shutdown(socket.SHUT_RDWR)

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def router_port():
    child = DyingChild()
    router = Router({"m": Path("/nonexistent/m.gguf")}, []).start()
    router.acquire = lambda name, **kw: ChildServer(
        name, Path("m.gguf"), port=child.port, api_key="k"
    )
    state = ServerState(ServerOptions(api_keys=("key",)))
    handle = listen(state, "127.0.0.1", 0, app=create_router_app(router, state))
    yield handle.port
    handle.stop()
    router.stop()
    child.close()


@pytest.fixture
def rconn(router_port):
    c = Conn(router_port, {"Authorization": "Bearer key"})
    yield c
    c.close()


@pytest.mark.parametrize(
    "body",
    [DEEP, b'{"model": "\\ud800"}', b'{"model": "m", "x": 1e999}', b"\xff"],
    ids=["deep", "surrogate", "overflow", "not-utf8"],
)
def test_router_rejects_hostile_json_with_a_400(rconn, body):
    for path in ("/v1/chat/completions", "/models/load"):
        status, raw = rconn.post(path, body)
        assert status == 400, raw
        error_of(status, raw)
    assert rconn.get("/v1/models")[0] == 200


def test_router_checks_the_key_before_the_body(router_port):
    c = Conn(router_port)
    status, raw = c.post("/v1/chat/completions", DEEP)
    assert status == 401 and error_of(status, raw)["type"] == "authentication_error"
    c.close()


def test_router_stream_from_a_dying_child_ends_with_an_error_event(rconn):
    status, raw = rconn.post("/v1/chat/completions", {**CHAT, "model": "m", "stream": True})
    assert status == 200
    events = [e for e in raw.decode().split("\n\n") if e]
    assert events[0] == 'data: {"choices":[{"delta":{"content":"a"}}]}'
    err = json.loads(events[-1].removeprefix("data: "))["error"]
    assert err["code"] == 502 and "'m'" in err["message"]
    assert len(events) == 2  # the half event is dropped
    assert rconn.get("/v1/models")[0] == 200  # the chunked body ended cleanly


def test_router_plain_answer_from_a_dying_child_is_a_502_naming_the_model(rconn):
    status, raw = rconn.post("/v1/chat/completions", {**CHAT, "model": "m"})
    assert status == 502 and "'m'" in error_of_5xx(raw)["message"]
    assert rconn.get("/v1/models")[0] == 200


def error_of_5xx(raw: bytes) -> dict:
    err = json.loads(raw)["error"]
    assert set(err) >= {"code", "message", "type"}
    return err


def test_a_client_that_leaves_is_logged_as_499_not_as_an_error():
    seen: list[dict] = []
    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append  # type: ignore[method-assign]
    logging.getLogger("uvicorn.error").addHandler(handler)
    sched = make_fake_scheduler(n_slots=1, n_ctx=8192, delay_s=0.002)
    handle = start_server(sched, port=0, chat_template=FakeChatTemplate(), request_log=seen.append)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                handle.url + "/completion", json={"prompt": "abc", "n_predict": -1}, timeout=0.3
            )
        deadline = time.monotonic() + 3
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [r["status"] for r in seen] == [499] and not errors
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
        handle.stop()
        sched.stop()
