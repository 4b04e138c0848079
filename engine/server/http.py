"""FastAPI app factory, the gate middleware (loading / API key / body size / request log)
and the uvicorn runner that listens on a background thread, with its connection guards (a
deadline for request heads, a cap on open connections).

The socket is bound here, before uvicorn starts, so that a port already in use is reported
at once with a free port to try instead, and so that port 0 works (the router's children).
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import logging
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import h11
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import APIError, EngineError, PortInUseError
from ..version import __version__
from . import routes_cors_proxy, vertex
from .errors import api_error, api_response, error_response, format_validation_errors, loading
from .state import ServerOptions, ServerState

log = logging.getLogger(__name__)

# What a browser loads before it has a key: llama-server serves these without one (its web UI
# and the files a PWA revalidates), and while the model is still loading.
FRONTEND_PATHS = (
    "/",
    "/index.html",
    "/sw.js",
    "/manifest.webmanifest",
    "/_app/version.json",
    "/build.json",
)
PUBLIC_PATHS = ("/health", "/v1/health", *FRONTEND_PATHS)


def create_app(state: ServerState) -> FastAPI:
    """The ASGI app serving `state` (which may still be loading)."""
    from . import anthropic, responses, routes, routes_embed, routes_monitor, routes_slots

    app = _App(
        title="ggstation",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.server = state
    prefix = state.options.api_prefix.rstrip("/")
    for module in (
        routes_monitor,
        routes_slots,
        routes,
        routes_embed,
        routes_cors_proxy,
        anthropic,
        responses,
        vertex,
    ):
        app.include_router(module.router, prefix=prefix)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return api_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return error_response(400, format_validation_errors(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = {404: "File Not Found", 405: "Method Not Allowed"}.get(
            exc.status_code, str(exc.detail)
        )
        if exc.status_code == 404:
            message = f"File Not Found: {request.url.path}"
        return error_response(
            exc.status_code,
            message,
            "not_found_error" if exc.status_code == 404 else "invalid_request_error",
        )

    install_middleware(app, state)
    return app


def install_middleware(app: FastAPI, state: ServerState) -> None:
    """The gate (CORS, loading, API keys, body size); the router's app (proxy.py) installs
    the same, so both modes answer preflights and keys alike."""
    app.add_middleware(GateMiddleware, state=state)


class _App(FastAPI):
    """FastAPI whose OpenAPI document also defines the request bodies the routes refer to."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            from .routing import with_body_schemas

            self.openapi_schema = with_body_schemas(super().openapi())
        return self.openapi_schema


class GateMiddleware:
    """Pure ASGI (streams pass through untouched), in llama-server's order: CORS headers on
    every response and preflights answered on every path; then 503 while loading, API keys,
    the Content-Length limit; the request-log callback, and the JSON 500 for an exception
    nothing else handled. One addition: the enabled /cors-proxy refuses other origins' pages
    (403, preflights too, and no CORS header on the refusal)."""

    def __init__(self, app, state: ServerState):
        self.app = app
        self.state = state
        # paths answered without a key: /health, and Vertex AI's AIP_HEALTH_ROUTE (its probes
        # carry none), read once, as create_app reads the routes it registers
        self._public = frozenset((*PUBLIC_PATHS, *filter(None, [vertex.health_route()])))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = {"code": 0}
        refusal = self._proxy_refusal(scope)
        # a refused proxy request gets no Access-Control-Allow-Origin: the page may not read it
        cors = (
            []
            if refusal is not None
            else cors_headers(self.state.options, _header(scope, b"origin"))
        )

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = list(message.get("headers", ()))
                if cors is not None:
                    # ours replace any a proxied child server sent, so none is doubled
                    headers = [
                        (k, v) for k, v in headers if k.lower() != b"access-control-allow-origin"
                    ]
                    headers += [(k.encode(), v.encode()) for k, v in cors]
                message = {**message, "headers": [(_canonical(k), v) for k, v in headers]}
            await send(message)

        try:
            if scope.get("method") == "OPTIONS":
                answer = (
                    _preflight(self.state.options) if refusal is None else api_response(refusal)
                )
                await answer(scope, receive, send_wrapper)
                return
            rejection = self._check(scope) or refusal
            if rejection is not None:
                await api_response(rejection)(scope, receive, send_wrapper)
            else:
                await self.app(scope, receive, send_wrapper)
        except Exception as e:
            # Answered here rather than by an exception handler: Starlette's outermost
            # middleware re-raises after its 500, and uvicorn then drops the keep-alive
            # connection, so the client's next request on it fails.
            if status["code"]:  # headers already sent: closing is the only signal left
                raise
            await api_response(api_error(e))(scope, receive, send_wrapper)
        finally:
            self._log(scope, status["code"], t0)

    def _local_path(self, scope) -> str:
        """The request's path without --api-prefix."""
        path = scope.get("path", "")
        prefix = self.state.options.api_prefix.rstrip("/")
        return (path[len(prefix) :] or "/") if prefix and path.startswith(prefix) else path

    def _proxy_refusal(self, scope) -> APIError | None:
        """The 403 for a page on another origin calling the enabled /cors-proxy (its rule:
        routes_cors_proxy.cross_origin_refusal); None for every other request."""
        opts = self.state.options
        if not opts.cors_proxy or self._local_path(scope) != routes_cors_proxy.PATH:
            return None
        headers: dict[str, str] = {}
        for k, v in scope.get("headers", ()):
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        return routes_cors_proxy.cross_origin_refusal(opts, scope.get("scheme", "http"), headers)

    def _check(self, scope) -> APIError | None:
        opts = self.state.options
        local = self._local_path(scope)
        if not self.state.is_ready and local not in FRONTEND_PATHS:
            if self.state.error:
                return APIError(500, f"model failed to load: {self.state.error}", "server_error")
            return loading()
        if opts.api_keys and local not in self._public:
            key = _request_key(scope)
            if key is None or not any(hmac.compare_digest(key, k) for k in opts.api_keys):
                return APIError(401, "Invalid API Key", "authentication_error")
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > opts.max_body_bytes:
                return APIError(
                    400,
                    f"request body too large ({int(value)} bytes; the limit is "
                    f"{opts.max_body_bytes})",
                )
        return None

    def _log(self, scope, status: int, t0: float) -> None:
        hook = self.state.options.request_log
        if hook is None:
            return
        client = scope.get("client") or ("", 0)
        try:
            hook(
                {
                    "method": scope.get("method"),
                    "path": scope.get("path"),
                    "status": status,
                    "duration_ms": (time.perf_counter() - t0) * 1e3,
                    "client": f"{client[0]}:{client[1]}",
                }
            )
        except Exception:
            log.exception("request log callback failed")


def _canonical(name: bytes) -> bytes:
    """Content-Type, not content-type: header names are case-insensitive, but clients that
    copy them into a plain dict (llama.cpp's own test suite does) look them up as llama-server
    spells them; Starlette lowercases them and h11 sends them as given."""
    return b"-".join(part[:1].upper() + part[1:] for part in name.split(b"-"))


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return v.decode("latin-1")
    return None


def _request_key(scope) -> str | None:
    """llama-server's order: Authorization (its Bearer prefix removed), else X-Api-Key."""
    auth = (_header(scope, b"authorization") or "").strip()
    if auth:
        return auth[7:].strip() if auth[:7].lower() == "bearer " else auth
    key = _header(scope, b"x-api-key")
    return key.strip() if key is not None else None


# -- CORS ---------------------------------------------------------------------------------


def origin_is_localhost(origin: str) -> bool:
    """The Origin's host is localhost, 127.0.0.1 or ::1 (any scheme, any port)."""
    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    return host in ("localhost", "127.0.0.1", "::1")


def allowed_origin(opts: ServerOptions, origin: str | None) -> str | None:
    """The Access-Control-Allow-Origin value for a request from `origin`; None sends none.

    llama-server's rules: '*' with credentials echoes the Origin (a credentialed response may
    not say '*'); 'localhost' echoes only a localhost Origin; one origin is always sent as is.
    Several origins: llama-server sends the list itself, which no browser accepts, so here
    the Origin is echoed when it is on the list.
    """
    origins = opts.cors_origins
    if not origins:
        return None  # CORS off (the desktop app's default)
    if origins == ("*",):
        return (origin or None) if opts.cors_credentials else "*"
    if origins == ("localhost",):
        if origin and origin_is_localhost(origin):
            return origin
        if origin:
            log.warning("CORS: not allowing the non-localhost origin %s", origin)
        return None
    if len(origins) == 1:
        return origins[0]
    return origin if origin in origins else None


def cors_headers(opts: ServerOptions, origin: str | None) -> list[tuple[str, str]] | None:
    """Headers every response carries; None when CORS is off."""
    if not opts.cors_origins:
        return None
    allow = allowed_origin(opts, origin)
    return [("access-control-allow-origin", allow)] if allow is not None else []


def _preflight(opts: ServerOptions) -> Response:
    """llama-server answers OPTIONS on every path, before the key check (browsers send no key
    with a preflight): 200, an empty body, and what is allowed."""
    headers = {}
    if opts.cors_origins:
        headers = {
            "Access-Control-Allow-Credentials": "true" if opts.cors_credentials else "false",
            "Access-Control-Allow-Methods": opts.cors_methods,
            "Access-Control-Allow-Headers": opts.cors_headers,
        }
    return Response(b"", status_code=200, media_type="text/html", headers=headers)


# -- listening -------------------------------------------------------------------------------


def parse_hosts(hosts: str) -> list[str]:
    """--host: comma-separated addresses (IPv6 with or without brackets), or UNIX socket
    paths ending in .sock.

    Raises:
        EngineError: no address given.
    """
    out = [h.strip() for h in hosts.split(",") if h.strip()]
    out = [h[1:-1] if h.startswith("[") and h.endswith("]") else h for h in out]
    if not out:
        raise EngineError("--host requires at least one address")
    return out


def bind_socket(host: str, port: int, v6only: bool = False) -> socket.socket:
    """A listening socket on host:port, or on the UNIX socket `host` when it ends in .sock.

    v6only: an IPv6 socket takes IPv6 only, so that [::] and 0.0.0.0 can both be listened on.

    Raises:
        PortInUseError: the port is taken (the message names a free one).
        EngineError: the address is not valid here.
    """
    if host.endswith(".sock"):
        return _bind_unix(host)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise EngineError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    family, _, proto, _, addr = infos[0]
    # proto must be IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only then, and
    # without it every keep-alive response waits ~40 ms for a delayed ACK (Nagle)
    sock = socket.socket(family, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6 and v6only:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            free = find_free_port(host, port + 1)
            hint = f"; try --port {free}" if free else ""
            raise PortInUseError(f"port {port} on {host} is already in use{hint}") from None
        raise EngineError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _bind_unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise EngineError(f"cannot listen on the UNIX socket {path}: {e.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def find_free_port(host: str, start: int, tries: int = 50) -> int | None:
    for port in range(start, min(start + tries, 65536)):
        with socket.socket(
            socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM
        ) as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    return None


class ServerHandle:
    """A running HTTP server on a background thread.

    Attributes:
        url: base URL clients use (http://host:port), for the first address listened on.
        urls: one per address (unix://PATH for a UNIX socket).
        port: the bound port (useful with port 0).
        state: the ServerState it serves.
    """

    def __init__(
        self,
        server: uvicorn.Server,
        thread: threading.Thread,
        state: ServerState,
        host: str,
        port: int,
        hosts: list[str] | None = None,
    ):
        self._server = server
        self._thread = thread
        self.state = state
        self.host = host
        self.port = port
        self.urls = [_url(h, port) for h in hosts or [host]]
        self.url = self.urls[0]

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, let open responses end (up to `timeout`), join the thread."""
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(1.0)


def _url(host: str, port: int) -> str:
    if host.endswith(".sock"):
        return f"unix://{host}"
    shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


# -- connection guards -----------------------------------------------------------------------

HEAD_TIMEOUT_S = 30.0  # request line + headers; a body and a streamed answer have no such limit
KEEP_ALIVE_S = 30  # idle between two requests on one connection


def default_max_connections() -> int:
    """Half the process's file-descriptor limit, 64..1024: room for the model, logs and a
    router's children, and never the EMFILE that makes asyncio stop accepting."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # no `resource` on Windows
        return 1024
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(64, min(1024, soft // 2))


def _raw_error(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 error response, sent by the connection itself before any request
    has reached the app; the body is the usual error JSON."""
    body = json.dumps(APIError(status, message).body(), separators=(",", ":")).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class _GuardedConfig(uvicorn.Config):
    """uvicorn's Config plus the two limits _GuardedH11 reads."""

    def __init__(self, app, *, head_timeout_s: float, max_connections: int, **kwargs: Any):
        super().__init__(app, **kwargs)
        self.head_timeout_s = head_timeout_s
        self.max_connections = max_connections


class _GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the two limits uvicorn lacks (0.55 has no header-read
    timeout: it times out only a connection idle after a response, so one that sends half a
    request head, or nothing, is held for ever):

    - the request head must be complete within head_timeout_s of its first byte (or of the
      connection opening): else a 408, or a silent close when nothing came;
    - at most max_connections are open: past that a new one gets a 503 and is closed at once.

    Bodies and answers are not timed here: a long upload or a stream of minutes goes on.
    h11 itself refuses a head over 16 KiB (uvicorn's h11_max_incomplete_event_size)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > getattr(self.config, "max_connections", len(self.connections)):
            log.warning("refusing a connection: %d are open", len(self.connections) - 1)
            transport.write(
                _raw_error(503, "Service Unavailable", "too many open connections; try again later")
            )
            transport.close()
            return
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self.conn.their_state is h11.IDLE:
            self._arm_head_timer()  # the next request's first bytes on a kept-alive connection
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a whole head was read
            self._cancel_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        timeout = getattr(self.config, "head_timeout_s", None)
        if timeout is not None and timeout > 0:
            self._head_timer = self.loop.call_later(timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # part of a head came: say why the connection ends
            self.transport.write(
                _raw_error(408, "Request Timeout", "request head not received in time")
            )
        self.transport.close()


def listen(
    state: ServerState,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    app=None,
    timeout_graceful_s: int = 3,
    log_level: str = "warning",
    head_timeout_s: float = HEAD_TIMEOUT_S,
    max_connections: int | None = None,
) -> ServerHandle:
    """Bind every address of `host` (comma-separated, as --host) on `port` and serve `state`
    (or `app`) on a background thread; returns once listening.

    head_timeout_s: how long a client may take to send a request head (0: no limit).
    max_connections: open connections at most (default: default_max_connections()).
    """
    hosts = parse_hosts(host)
    n_tcp = sum(not h.endswith(".sock") for h in hosts)
    if port == 0 and n_tcp > 1:
        raise EngineError("--port 0 is not supported with several TCP addresses")
    socks: list[socket.socket] = []
    try:
        for h in hosts:
            socks.append(bind_socket(h, port, v6only=n_tcp > 1))
            if port == 0 and socks[-1].family != socket.AF_UNIX:
                port = socks[-1].getsockname()[1]
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    config = _GuardedConfig(
        app if app is not None else create_app(state),
        lifespan="off",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=timeout_graceful_s,
        timeout_keep_alive=KEEP_ALIVE_S,
        http=_GuardedH11,
        loop="asyncio",
        head_timeout_s=head_timeout_s,
        max_connections=max_connections
        if max_connections is not None
        else default_max_connections(),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": socks}, name="http", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    if not server.started:
        raise EngineError(f"the HTTP server did not start on {host}:{port}")
    return ServerHandle(server, thread, state, hosts[0], port, hosts)
