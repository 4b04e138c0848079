"""The router's HTTP app: model management endpoints plus a plain-HTTP proxy that sends each
inference request to the child server holding the requested `model` (engine/router.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response, StreamingResponse

from ..errors import APIError, RouterError, UnknownModelError
from ..router import ChildServer, Router
from .bodies import load_json, read_body
from .errors import api_response, error_response, invalid
from .http import GateMiddleware
from .openai import sse
from .state import ServerState, ServerStatus

POST_PATHS = ["/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/completion",
              "/v1/embeddings", "/embeddings", "/embedding", "/tokenize", "/detokenize", "/apply-template"]
GET_PATHS = ["/props", "/slots", "/metrics"]
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host",
               "authorization", "x-api-key"}


def create_router_app(router: Router, state: ServerState) -> FastAPI:
    """FastAPI app for router mode; `state` carries the options (API keys, CORS, body limit)."""
    state.status = ServerStatus.READY  # the router itself needs no model
    app = FastAPI(title="ggstation router", docs_url=None, redoc_url=None)
    app.state.server = state
    app.state.router = router
    app.state.upstream = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return api_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc):
        return error_response(exc.status_code, f"File Not Found: {request.url.path}"
                              if exc.status_code == 404 else str(exc.detail))

    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        return {"status": "ok"}

    @app.get("/models")
    @app.get("/v1/models")
    async def models():
        data = [{**m, "object": "model", "owned_by": "ggstation", "created": state.created}
                for m in router.models_info()]
        return {"object": "list", "data": data}

    @app.post("/models/load")
    async def load(request: Request):
        name = await _model_field(request, state)
        await run_in_threadpool(_call, router.load, name)
        return {"success": True}

    @app.post("/models/unload")
    async def unload(request: Request):
        name = await _model_field(request, state)
        await run_in_threadpool(_call, router.unload, name)
        return {"success": True}

    for path in POST_PATHS:
        app.add_api_route(path, _proxy, methods=["POST"], include_in_schema=False)
    for path in GET_PATHS:
        app.add_api_route(path, _proxy, methods=["GET"], include_in_schema=False)

    app.add_middleware(GateMiddleware, state=state)
    if state.options.cors_origins:
        origins = list(state.options.cors_origins)
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["*"], allow_credentials="*" not in origins)
    return app


def _call(fn, *args):
    try:
        return fn(*args)
    except UnknownModelError as e:
        raise APIError(404, str(e), "not_found_error") from None
    except RouterError as e:
        raise APIError(503 if "in time" in str(e) or "loading" in str(e) else 400, str(e)) from None


async def _model_field(request: Request, state) -> str:
    raw = await read_body(request, state.options.max_body_bytes)
    data = load_json(raw) if raw.strip() else {}
    name = data.get("model") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name:
        raise invalid("'model' (a string) is required")
    return name


async def _proxy(request: Request):
    router: Router = request.app.state.router
    state = request.app.state.server
    body = b""
    name = request.query_params.get("model")
    if request.method == "POST":
        body = await read_body(request, state.options.max_body_bytes)
        data = load_json(body)
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            name = data["model"]
    if not name:
        loaded = [m["id"] for m in router.models_info() if m["status"]["value"] == "loaded"]
        if len(loaded) != 1:
            raise invalid("'model' is required: name one of the models listed by GET /v1/models")
        name = loaded[0]
    child = await run_in_threadpool(_call, router.ensure_ready, name)
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
    headers["authorization"] = f"Bearer {child.api_key}"
    client: httpx.AsyncClient = request.app.state.upstream
    upstream = client.build_request(request.method, child.url + request.url.path,
                                    params=[(k, v) for k, v in request.query_params.multi_items() if k != "model"],
                                    headers=headers, content=body)
    try:
        resp = await client.send(upstream, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        raise APIError(503, f"model '{name}' is not reachable: {e}") from None
    except httpx.TransportError as e:
        raise await _broken(name, child, e) from None
    out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        return _Relay(resp, lambda e: _broken(name, child, e), status_code=resp.status_code, headers=out_headers)
    try:  # a plain answer is read whole, so a child that dies half-way is still a clean 502
        content = await resp.aread()
    except httpx.TransportError as e:
        raise await _broken(name, child, e) from None
    finally:
        await resp.aclose()
    return Response(content, status_code=resp.status_code, headers=out_headers)


async def _broken(name: str, child: ChildServer, e: Exception) -> APIError:
    """The 502 for a child that stopped in the middle of an answer, with its exit code when
    it exited (a killed child's socket closes a moment before the process is gone)."""
    proc = child.proc
    for _ in range(25):
        if proc is None or proc.poll() is not None:
            break
        await asyncio.sleep(0.02)
    code = proc.returncode if proc is not None else child.exit_code
    why = f"its server exited with code {code}" if code is not None else f"the connection to its server broke ({e})"
    return APIError(502, f"model '{name}' stopped before finishing its answer: {why}", "server_error")


class _Relay(StreamingResponse):
    """Streams the child's events; closes the upstream connection however it ends, so a client
    that goes away cancels the child's generation too."""

    def __init__(self, upstream: httpx.Response, broken: Callable[[Exception], Awaitable[APIError]], **kw):
        super().__init__(_events(upstream, broken), **kw)
        self._upstream = upstream

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._upstream.aclose()


async def _events(upstream: httpx.Response, broken: Callable[[Exception], Awaitable[APIError]]):
    """Whole SSE events from the child. If it dies mid-stream, its half event is dropped and
    an error event ends the stream (as llama-server reports errors once streaming), so the
    client gets a well-formed body instead of a broken chunked read."""
    pending = b""
    try:
        async for chunk in upstream.aiter_raw():
            pending += chunk
            cut = pending.rfind(b"\n\n") + 2
            if cut >= 2:
                yield pending[:cut]
                pending = pending[cut:]
    except httpx.TransportError as e:
        yield sse((await broken(e)).body())
        return
    if pending:
        yield pending
