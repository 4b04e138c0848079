"""llama-server's security rules over the fake scheduler: CORS (preflights on every path, the
'*' / 'localhost' / one-origin rules), the API key (Bearer, X-Api-Key, public paths), /cors-proxy,
and listening on several addresses."""

from __future__ import annotations

import argparse
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from engine.errors import EngineError
from engine.server import ServerOptions, start_server
from engine.server import flags as server_flags
from engine.server.http import allowed_origin, origin_is_localhost, parse_hosts
from engine.server.routes_cors_proxy import forwarded_headers, target_url
from engine.server.testing import FakeChatTemplate, make_fake_scheduler

KEY = "sk-secret"
PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "Authorization",
}


@pytest.fixture(scope="module")
def sched():
    s = make_fake_scheduler(n_slots=2, n_ctx=512)
    yield s
    s.stop()


def _serve(sched, **opts):
    options = ServerOptions(**{"api_keys": (KEY,), "cors_origins": ("*",), **opts})
    return start_server(sched, port=0, options=options, chat_template=FakeChatTemplate())


@pytest.fixture(scope="module")
def server(sched):
    handle = _serve(sched)
    yield handle
    handle.stop()


# -- CORS --------------------------------------------------------------------------------


def test_preflight_is_answered_on_any_path_without_a_key(server):
    for path in ("/completions", "/v1/chat/completions", "/no/such/route"):
        r = httpx.options(server.url + path, headers={"Origin": "web.mydomain.fr", **PREFLIGHT})
        assert r.status_code == 200 and r.content == b""
        assert (
            r.headers["access-control-allow-origin"] == "web.mydomain.fr"
        )  # '*' + credentials: echoed
        assert r.headers["access-control-allow-credentials"] == "true"
        assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        assert r.headers["access-control-allow-headers"] == "*"


def test_header_names_are_sent_as_llama_server_spells_them(server):
    r = httpx.options(server.url + "/completions", headers={"Origin": "http://a.b", **PREFLIGHT})
    names = {k for k, _ in r.headers.raw}
    assert {
        b"Access-Control-Allow-Origin",
        b"Access-Control-Allow-Credentials",
        b"Content-Type",
    } <= names


def test_every_response_carries_the_origin_even_a_401(server):
    r = httpx.get(server.url + "/v1/models", headers={"Origin": "http://a.example"})
    assert r.status_code == 401
    assert r.headers["access-control-allow-origin"] == "http://a.example"


@pytest.mark.parametrize(
    "origin, ok",
    [
        ("http://localhost", True),
        ("http://localhost:8080", True),
        ("http://127.0.0.1:3000", True),
        ("http://[::1]", True),
        ("http://[::1]:3000", True),
        ("http://evil.com", False),
        ("http://notlocalhost", False),
        ("http://localhost.evil.com", False),
        ("not a url", False),
    ],
)
def test_localhost_rule(origin, ok):
    assert origin_is_localhost(origin) is ok
    opts = ServerOptions(cors_origins=("localhost",))
    assert allowed_origin(opts, origin) == (origin if ok else None)


def test_origin_rules():
    assert (
        allowed_origin(ServerOptions(cors_origins=("*",), cors_credentials=False), "http://x")
        == "*"
    )
    assert allowed_origin(ServerOptions(cors_origins=("*",)), "http://x") == "http://x"
    assert (
        allowed_origin(ServerOptions(cors_origins=("https://app.example",)), "http://x")
        == "https://app.example"
    )
    several = ServerOptions(cors_origins=("https://a.example", "https://b.example"))
    assert allowed_origin(several, "https://b.example") == "https://b.example"
    assert allowed_origin(several, "https://c.example") is None
    assert allowed_origin(ServerOptions(), "http://x") is None  # the desktop app's default: off


def test_localhost_origins_refuse_other_sites(sched):
    handle = _serve(sched, cors_origins=("localhost",), cors_credentials=False, cors_methods="GET")
    try:
        r = httpx.options(
            handle.url + "/completions", headers={"Origin": "http://evil.com", **PREFLIGHT}
        )
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        assert r.headers["access-control-allow-credentials"] == "false"
        assert r.headers["access-control-allow-methods"] == "GET"
        r = httpx.options(
            handle.url + "/completions", headers={"Origin": "http://127.0.0.1:9", **PREFLIGHT}
        )
        assert r.headers["access-control-allow-origin"] == "http://127.0.0.1:9"
    finally:
        handle.stop()


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    server_flags.add_server_args(p)
    p.set_defaults(ignored=[])
    return p.parse_args(list(argv))


def test_tools_make_localhost_the_default_origin():
    assert server_flags.cors_origins(_args()) == ("*",)
    assert server_flags.cors_origins(_args("--tools", "all")) == ("localhost",)
    assert server_flags.cors_origins(_args("--tools", "all", "--cors-origins", "*")) == ("*",)
    assert server_flags.cors_origins(_args("--cors-origins", "a.example, b.example")) == (
        "a.example",
        "b.example",
    )


# -- API key -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer nope"},
        {"X-Api-Key": "nope"},
        {"Authorization": "Bearer nope", "X-Api-Key": KEY},
    ],
)
def test_a_missing_or_wrong_key_is_401(server, headers):
    r = httpx.post(
        server.url + "/completions", json={"prompt": "a", "n_predict": 1}, headers=headers
    )
    assert r.status_code == 401
    assert r.json()["error"] == {
        "code": 401,
        "message": "Invalid API Key",
        "type": "authentication_error",
    }


@pytest.mark.parametrize(
    "headers", [{"Authorization": f"Bearer {KEY}"}, {"X-Api-Key": KEY}, {"Authorization": KEY}]
)
def test_the_key_is_accepted_in_either_header(server, headers):
    r = httpx.post(
        server.url + "/completions", json={"prompt": "a", "n_predict": 1}, headers=headers
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "path", ["/health", "/v1/health", "/sw.js", "/manifest.webmanifest", "/_app/version.json"]
)
def test_public_paths_need_no_key(server, path):
    assert httpx.get(server.url + path).status_code == 200


def test_slots_metrics_and_props_need_the_key(server):
    for path in ("/slots", "/props", "/metrics", "/cors-proxy"):
        assert httpx.get(server.url + path).status_code == 401, path


# -- /cors-proxy -------------------------------------------------------------------------


def test_cors_proxy_is_403_when_disabled(server):
    for method in ("GET", "POST"):
        r = httpx.request(
            method, server.url + "/cors-proxy?url=http://127.0.0.1:1/", headers={"X-Api-Key": KEY}
        )
        assert r.status_code == 403
        assert r.json() == {
            "error": {"message": "this feature is disabled", "type": "feature_disabled"}
        }


class _Capture(BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.captured = dict(self.headers)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"ok")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.captured = {"body": body.decode()}  # type: ignore[attr-defined]
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def target():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    srv.captured = {}  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_cors_proxy_forwards_only_explicit_headers(sched, target):
    handle = _serve(sched, cors_proxy=True)
    try:
        r = httpx.get(
            f"{handle.url}/cors-proxy?url=http://127.0.0.1:{target.server_port}/capture",
            headers={
                "Authorization": f"Bearer {KEY}",
                "Proxy-Authorization": "Basic secret",
                "Cookie": "s=secret",
                "x-llama-server-proxy-header-accept": "application/json",
                "x-llama-server-proxy-header-authorization": "Bearer explicit",
            },
        )
        assert r.status_code == 200 and r.text == "ok"
        captured = {k.lower(): v for k, v in target.captured.items()}
        assert (
            captured["accept"] == "application/json"
            and captured["authorization"] == "Bearer explicit"
        )
        assert not {"proxy-authorization", "cookie", "x-api-key"} & captured.keys()
        r = httpx.post(
            f"{handle.url}/cors-proxy?url=http://127.0.0.1:{target.server_port}/",
            content=b'{"a": 1}',
            headers={"X-Api-Key": KEY},
        )
        assert r.status_code == 204 and r.content == b""
        assert target.captured == {"body": '{"a": 1}'}
        assert (
            httpx.get(handle.url + "/props", headers={"X-Api-Key": KEY}).json()[
                "cors_proxy_enabled"
            ]
            is True
        )
    finally:
        handle.stop()


@pytest.mark.parametrize(
    "url, message",
    [
        ("", "required"),
        ("ftp://host/x", "scheme"),
        ("http:///path", "missing host"),
        ("http://user:pw@host/", "authentication"),
    ],
)
def test_cors_proxy_refuses_bad_urls(url, message):
    from engine.errors import APIError

    with pytest.raises(APIError, match=message) as e:
        target_url(url)
    assert e.value.status == 400


def test_forwarded_headers_strip_the_prefix_and_drop_the_rest():
    got = forwarded_headers(
        [
            ("X-Llama-Server-Proxy-Header-Accept", "a/b"),
            ("Cookie", "c"),
            ("x-llama-server-proxy-header-", "empty"),
            ("x-llama-server-proxy-header-host", "h"),
        ]
    )
    assert got == {"accept": "a/b"}


# -- several addresses -------------------------------------------------------------------


def test_parse_hosts():
    assert parse_hosts("127.0.0.1, [::1] ,") == ["127.0.0.1", "::1"]
    with pytest.raises(EngineError, match="at least one"):
        parse_hosts(" , ")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_listens_on_every_address(sched):
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    port = _free_port()
    handle = start_server(sched, host="127.0.0.1,::1", port=port, chat_template=FakeChatTemplate())
    try:
        assert handle.urls == [f"http://127.0.0.1:{port}", f"http://[::1]:{port}"]
        for url in handle.urls:
            assert httpx.get(url + "/health").json() == {"status": "ok"}
    finally:
        handle.stop()


def test_port_0_with_several_addresses_is_refused(sched):
    with pytest.raises(EngineError, match="port 0"):
        start_server(sched, host="127.0.0.1,127.0.0.2", port=0)
