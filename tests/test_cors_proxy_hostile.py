"""/cors-proxy against hostile callers: pages on other origins (Origin, preflights, Fetch
Metadata, DNS rebinding) must not read local services through it, and target URLs that the
HTTP client cannot use (bad ports, control characters, IDNA errors, octal IPv4) are 400s."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from engine.server import ServerOptions, start_server
from engine.server.routes_cors_proxy import cross_origin_refusal
from engine.server.testing import FakeChatTemplate, make_fake_scheduler

SECRET = b"local secret"


class _Local(BaseHTTPRequestHandler):
    """A service on 127.0.0.1 that only this machine should read; /redirect?to=URL redirects."""

    def do_GET(self):
        if self.path.startswith("/redirect?to="):
            self.send_response(302)
            self.send_header("Location", self.path[len("/redirect?to=") :])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(SECRET)))
        self.end_headers()
        self.wfile.write(SECRET)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def local():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Local)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def sched():
    s = make_fake_scheduler(n_slots=1, n_ctx=256)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def server(sched):
    """The risky setup: the proxy on, no API key, CORS at its default ('*', Origin echoed)."""
    handle = start_server(
        sched,
        port=0,
        chat_template=FakeChatTemplate(),
        options=ServerOptions(cors_origins=("*",), cors_proxy=True),
    )
    yield handle
    handle.stop()


def _proxy(server, local, method="GET", path="/", **headers) -> httpx.Response:
    return httpx.request(
        method,
        server.url + "/cors-proxy",
        params={"url": local + path},
        headers=headers,
        timeout=10,
    )


def _assert_refused(r: httpx.Response, origin: str | None = None) -> None:
    assert r.status_code == 403, r.text
    assert SECRET not in r.content
    error = r.json()["error"]
    assert error["code"] == 403 and error["type"] == "permission_error"
    assert "/cors-proxy" in error["message"] and "--cors-origins" in error["message"]
    assert "access-control-allow-origin" not in r.headers, origin


# -- who may use it ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin",
    ["http://evil.example", "null", "http://127.0.0.1:1", "http://localhost", "not an origin"],
)
def test_cors_proxy_refuses_a_foreign_origin(server, local, origin):
    for method in ("GET", "POST"):
        _assert_refused(_proxy(server, local, method, Origin=origin), origin)


def test_cors_proxy_refuses_a_foreign_preflight(server, local):
    r = _proxy(
        server,
        local,
        "OPTIONS",
        Origin="http://evil.example",
        **{
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    _assert_refused(r)
    # the rest of the server still answers preflights as before
    r = httpx.options(server.url + "/v1/models", headers={"Origin": "http://evil.example"})
    assert (
        r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://evil.example"
    )


@pytest.mark.parametrize("site", ["cross-site", "same-site", "CROSS-SITE"])
def test_cors_proxy_refuses_other_sites_without_an_origin(server, local, site):
    # a no-cors <img>/<script> GET carries no Origin; Fetch Metadata still says where it came from
    _assert_refused(_proxy(server, local, **{"Sec-Fetch-Site": site}))


def test_cors_proxy_refuses_a_rebound_host_name(server, local):
    # DNS rebinding: evil.example now resolves to this machine, so the page is "same-origin"
    host = f"evil.example:{server.port}"
    _assert_refused(
        _proxy(
            server, local, Host=host, Origin=f"http://{host}", **{"Sec-Fetch-Site": "same-origin"}
        )
    )
    _assert_refused(_proxy(server, local, Host=host))


def test_cors_proxy_serves_this_servers_own_pages(server, local):
    own = f"http://127.0.0.1:{server.port}"
    for headers in (
        {},
        {"Origin": own},
        {"Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "none"},
        {"Origin": f"http://localhost:{server.port}", "Host": f"localhost:{server.port}"},
    ):
        r = _proxy(server, local, **headers)
        assert r.status_code == 200 and r.content == SECRET, headers


def test_cors_proxy_serves_a_listed_origin(sched, local):
    app = "https://app.example"
    handle = start_server(
        sched,
        port=0,
        chat_template=FakeChatTemplate(),
        options=ServerOptions(cors_origins=(app, "https://other.example"), cors_proxy=True),
    )
    try:
        r = _proxy(handle, local, Origin=app, **{"Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 200 and r.content == SECRET
        assert r.headers["access-control-allow-origin"] == app
        r = _proxy(
            handle, local, "OPTIONS", Origin=app, **{"Access-Control-Request-Method": "POST"}
        )
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == app
        _assert_refused(_proxy(handle, local, Origin="https://third.example"))
    finally:
        handle.stop()


def test_cors_proxy_localhost_keyword_is_not_a_listing(sched, local):
    # --cors-origins localhost lets any local page call the API, but another local port is
    # another origin: it may not make this server fetch for it
    handle = start_server(
        sched,
        port=0,
        chat_template=FakeChatTemplate(),
        options=ServerOptions(cors_origins=("localhost",), cors_proxy=True),
    )
    try:
        _assert_refused(_proxy(handle, local, Origin="http://localhost:3000"))
        assert _proxy(handle, local).content == SECRET
    finally:
        handle.stop()


def test_cors_proxy_key_is_still_checked_first(sched, local):
    handle = start_server(
        sched,
        port=0,
        chat_template=FakeChatTemplate(),
        options=ServerOptions(api_keys=("k",), cors_proxy=True),
    )
    try:
        assert _proxy(handle, local, Origin="http://evil.example").status_code == 401
        _assert_refused(
            _proxy(handle, local, Origin="http://evil.example", Authorization="Bearer k")
        )
        r = _proxy(handle, local, Authorization="Bearer k")
        assert r.status_code == 200 and r.content == SECRET
    finally:
        handle.stop()


@pytest.mark.parametrize(
    "headers, ok",
    [
        ({"host": "127.0.0.1:8080"}, True),
        ({"host": "[::1]:8080", "origin": "http://[::1]:8080"}, True),
        (
            {"host": "127.0.0.1", "origin": "http://127.0.0.1:80"},
            True,
        ),  # the default port, written out
        ({"host": "127.0.0.1:8080", "origin": "https://127.0.0.1:8080"}, False),  # another scheme
        ({"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8081"}, False),  # another port
        ({"host": "localhost:8080", "origin": "http://localhost:8080"}, True),
        ({"host": "app.localhost:8080"}, True),
        ({"host": "example.com:8080"}, False),  # a DNS name can be rebound to this machine
        ({}, False),  # no Host at all: whose page is it?
        ({"host": "127.0.0.1:8080", "sec-fetch-site": "cross-site"}, False),
        (
            {
                "host": "127.0.0.1:8080",
                "origin": "http://127.0.0.1:8080",
                "sec-fetch-site": "same-origin",
            },
            True,
        ),
    ],
)
def test_cross_origin_refusal_rule(headers, ok):
    refusal = cross_origin_refusal(
        ServerOptions(cors_origins=("*",), cors_proxy=True), "http", headers
    )
    assert (refusal is None) is ok, refusal


def test_cross_origin_refusal_accepts_listed_names():
    opts = ServerOptions(cors_origins=("https://llm.example.com", "web.mydomain.fr"))
    # behind a TLS proxy: the Host is the listed name, the Origin the listed origin
    assert (
        cross_origin_refusal(
            opts, "http", {"host": "llm.example.com", "origin": "https://llm.example.com"}
        )
        is None
    )
    assert cross_origin_refusal(opts, "http", {"host": "llm.example.com"}) is None
    assert (
        cross_origin_refusal(opts, "http", {"host": "127.0.0.1", "origin": "web.mydomain.fr"})
        is None
    )
    assert cross_origin_refusal(opts, "http", {"host": "evil.example"}) is not None


# -- target URLs the HTTP client cannot use -----------------------------------------------------


@pytest.mark.parametrize(
    "url, words",
    [
        ("http://0177.0.0.1/", "IPv4"),
        ("http://127.0.0.1:99999/", "port"),
        ("http://127.0.0.1:-1/", "port"),
        ("http://127.0.0.1:abc/", "port"),
        ("http://127.0.0.1:0/", "port"),
        ("http://127.0.0.1/\r\nX-Injected: 1", "control character"),
        ("http://127.0.0.1/\x00", "control character"),
        ("http://127.0.0.1/\x7f", "control character"),
        ("http://\u2488.example/", "IDNA"),
        ("http://a b/", "whitespace"),
        ("http://[::1/", "IPv6"),
    ],
)
def test_cors_proxy_unusable_urls_are_400(server, url, words):
    r = httpx.get(server.url + "/cors-proxy", params={"url": url}, timeout=10)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert "target URL" in error["message"] and words.lower() in error["message"].lower(), error[
        "message"
    ]


@pytest.mark.parametrize(
    "to", ["http://127.0.0.1:99999/", "http://0177.0.0.1/", "http://\u2488.example/"]
)
def test_cors_proxy_redirect_to_an_unusable_url_is_502(server, local, to):
    r = _proxy(server, local, path=f"/redirect?to={to}")
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == 502 and error["message"].startswith("proxy error")
