"""FastAPI app factory, the gate middleware (loading / API key / body size / request log)
and the uvicorn runner that listens on a background thread.

The socket is bound here, before uvicorn starts, so that a port already in use is reported
at once with a free port to try instead, and so that port 0 works (the router's children).
"""

from __future__ import annotations

import errno
import hmac
import logging
import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from ..errors import APIError, EngineError, PortInUseError
from ..version import __version__
from .errors import api_error, api_response, error_response, format_validation_errors, loading
from .state import ServerState

log = logging.getLogger(__name__)

PUBLIC_PATHS = ("/health", "/v1/health")


def create_app(state: ServerState) -> FastAPI:
    """The ASGI app serving `state` (which may still be loading)."""
    from . import anthropic, responses, routes, routes_embed, routes_monitor, routes_slots, vertex

    app = _App(title="ggstation", version=__version__, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.server = state
    prefix = state.options.api_prefix.rstrip("/")
    for module in (routes_monitor, routes_slots, routes, routes_embed, anthropic, responses, vertex):
        app.include_router(module.router, prefix=prefix)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return api_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return error_response(400, format_validation_errors(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = {404: "File Not Found", 405: "Method Not Allowed"}.get(exc.status_code, str(exc.detail))
        if exc.status_code == 404:
            message = f"File Not Found: {request.url.path}"
        return error_response(exc.status_code, message,
                              "not_found_error" if exc.status_code == 404 else "invalid_request_error")

    install_middleware(app, state)
    return app


def install_middleware(app: FastAPI, state: ServerState) -> None:
    """The gate (loading, API keys, body size) and CORS; the router's app (proxy.py) installs
    the same, so both modes answer preflights and keys alike."""
    app.add_middleware(GateMiddleware, state=state)
    if state.options.cors_origins:
        origins = list(state.options.cors_origins)
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                           allow_headers=["*"], allow_credentials="*" not in origins)


class _App(FastAPI):
    """FastAPI whose OpenAPI document also defines the request bodies the routes refer to."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            from .routing import with_body_schemas

            self.openapi_schema = with_body_schemas(super().openapi())
        return self.openapi_schema


class GateMiddleware:
    """Pure ASGI (streams pass through untouched): 503 while loading, API keys, Content-Length
    limit, the request-log callback, and the JSON 500 for an exception nothing else handled."""

    def __init__(self, app, state: ServerState):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = {"code": 0}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        rejection = self._check(scope)
        try:
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

    def _check(self, scope) -> APIError | None:
        opts = self.state.options
        path = scope.get("path", "")
        if scope.get("method") == "OPTIONS":
            return None  # CORS preflight
        if not self.state.is_ready:
            if self.state.error:
                return APIError(500, f"model failed to load: {self.state.error}", "server_error")
            return loading()
        if opts.api_keys and path.removeprefix(opts.api_prefix.rstrip("/")) not in PUBLIC_PATHS:
            key = _request_key(scope)
            if key is None or not any(hmac.compare_digest(key, k) for k in opts.api_keys):
                return APIError(401, "Invalid API Key", "authentication_error")
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > opts.max_body_bytes:
                return APIError(400, f"request body too large ({int(value)} bytes; the limit is "
                                f"{opts.max_body_bytes})")
        return None

    def _log(self, scope, status: int, t0: float) -> None:
        hook = self.state.options.request_log
        if hook is None:
            return
        client = scope.get("client") or ("", 0)
        try:
            hook({"method": scope.get("method"), "path": scope.get("path"), "status": status,
                  "duration_ms": (time.perf_counter() - t0) * 1e3, "client": f"{client[0]}:{client[1]}"})
        except Exception:
            log.exception("request log callback failed")


def _request_key(scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            v = value.decode("latin-1").strip()
            if v[:7].lower() == "bearer ":
                return v[7:].strip()
        elif name == b"x-api-key":
            return value.decode("latin-1").strip()
    return None


# -- listening -------------------------------------------------------------------------------


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port.

    Raises:
        PortInUseError: the port is taken (the message names a free one).
        EngineError: the address is not valid here.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise EngineError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    family, _, proto, _, addr = infos[0]
    # proto must be IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only then, and
    # without it every keep-alive response waits ~40 ms for a delayed ACK (Nagle)
    sock = socket.socket(family, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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


def find_free_port(host: str, start: int, tries: int = 50) -> int | None:
    for port in range(start, min(start + tries, 65536)):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    return None


class ServerHandle:
    """A running HTTP server on a background thread.

    Attributes:
        url: base URL clients use (http://host:port).
        port: the bound port (useful with port 0).
        state: the ServerState it serves.
    """

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, state: ServerState,
                 host: str, port: int):
        self._server = server
        self._thread = thread
        self.state = state
        self.host = host
        self.port = port
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.url = f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"

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


def listen(state: ServerState, host: str = "127.0.0.1", port: int = 8080, *, app=None,
           timeout_graceful_s: int = 3, log_level: str = "warning") -> ServerHandle:
    """Bind host:port and serve `state` (or `app`) on a background thread; returns once listening."""
    sock = bind_socket(host, port)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app if app is not None else create_app(state), lifespan="off", log_level=log_level,
                            access_log=False, timeout_graceful_shutdown=timeout_graceful_s, timeout_keep_alive=30,
                            http="h11", loop="asyncio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    if not server.started:
        raise EngineError(f"the HTTP server did not start on {host}:{port}")
    return ServerHandle(server, thread, state, host, port)
