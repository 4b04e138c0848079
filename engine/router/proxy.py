"""The router's HTTP app: model management endpoints plus a proxy that sends each inference
request to the child server holding the requested `model` (engine/router/supervisor.py), over plain HTTP;
`serve --ray` puts its RayUpstream (engine/cluster/upstream.py) behind the same `Upstream`
protocol, so both modes share every endpoint here.

What llama-server's router answers (tools/server/server-models.cpp `init_routes`): the model is
the body's `model` for a POST, the `model` query parameter for a GET; `?autoload=true|false`
overrides --models-autoload per request; GET /props without a model describes the router.
A request waits while its model loads (queued behind --models-max); the router watches the
client meanwhile, and one that leaves gives its place up.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import anyio
import anyio.to_thread
import httpx
from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response, StreamingResponse

from ..errors import (
    APIError,
    ModelLimitError,
    PresetError,
    RequestCancelled,
    RouterError,
    UnknownModelError,
)
from ..server import routes_cors_proxy, vertex
from ..server.bodies import load_json, read_body
from ..server.errors import api_response, error_response, invalid
from ..server.http import install_middleware
from ..server.openai import sse
from ..server.state import ServerState, ServerStatus
from ..version import __version__, git_commit
from .supervisor import ChildServer, ModelStatus, Router

# llama-server's routes that a router hands to a child (server.cpp, router branch)
POST_PATHS = [
    "/completion",
    "/completions",
    "/v1/completions",
    "/chat/completions",
    "/v1/chat/completions",
    "/v1/chat/completions/control",
    "/v1/responses",
    "/responses",
    "/v1/audio/transcriptions",
    "/audio/transcriptions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/infill",
    "/embedding",
    "/embeddings",
    "/v1/embeddings",
    "/rerank",
    "/reranking",
    "/v1/rerank",
    "/v1/reranking",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/chat/completions/input_tokens",
    "/v1/chat/completions/input_tokens",
    "/responses/input_tokens",
    "/v1/responses/input_tokens",
    "/lora-adapters",
    "/slots/{id_slot}",
    "/props",
]
GET_PATHS = ["/metrics", "/slots", "/lora-adapters"]
HOP_HEADERS = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",
    "host",
    "authorization",
    "x-api-key",
}
INFO_TIMEOUT_S = 2.0  # a loaded child's own /v1/models, merged into the router's listing
DISCONNECT_POLL_S = 0.1
MAX_WAITING = 1024  # requests that may wait for their model at once


class Upstream(Protocol):
    """How the router app reaches a running model: over HTTP to its child server
    (HttpUpstream), or through a Ray Serve deployment handle (engine/cluster/upstream.py)."""

    async def forward(
        self, request: Request, child: ChildServer, body: bytes, release: Callable[[], None]
    ) -> Response:
        """The model's answer to `request` (whose body was read already: `body`); `release`
        runs once that answer has been relayed, or has failed."""
        ...

    async def model_info(self, child: ChildServer) -> dict | None:
        """The model's own /v1/models entry, or None when it does not answer in time."""
        ...

    async def health(self) -> dict:
        """GET /health: "ok", and what the upstream knows of the models' hosts."""
        ...


def create_router_app(
    router: Router, state: ServerState, upstream: Upstream | None = None
) -> FastAPI:
    """FastAPI app for router mode; `state` carries the options (API keys, CORS, body limit);
    `upstream` reaches the models (default: their child servers over HTTP)."""
    state.status = ServerStatus.READY  # the router itself needs no model
    app = FastAPI(title="ggstation router", docs_url=None, redoc_url=None)
    app.state.server = state
    app.state.router = router
    app.state.upstream = upstream if upstream is not None else HttpUpstream()
    prefix = state.options.api_prefix.rstrip("/")

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return api_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc):
        return error_response(
            exc.status_code,
            f"File Not Found: {request.url.path}" if exc.status_code == 404 else str(exc.detail),
        )

    async def health(request: Request):
        upstream: Upstream = request.app.state.upstream
        return await upstream.health()

    async def models(request: Request):
        if request.query_params.get("reload") or router.need_reload:
            await run_in_threadpool(_call, router.reload)
        return {"data": await _listing(request.app), "object": "list"}

    async def load(request: Request):
        name = await _model_field(request, state)
        child = _call(router.get, name, unknown=(404, "model is not found"))
        if child.running:
            raise invalid("model is already running")
        await run_in_threadpool(_call, router.load, child.name)
        return {"success": True}

    async def unload(request: Request):
        name = await _model_field(request, state)
        child = _call(router.get, name, unknown=(400, "model is not found"))
        if not child.running and child.status is not ModelStatus.DOWNLOADING:
            raise invalid("model is not running")
        await run_in_threadpool(_call, router.unload, child.name)
        return {"success": True}

    async def events(request: Request):
        return _event_stream(router)

    async def download(request: Request):
        name = await _model_field(request, state)
        await run_in_threadpool(_call, router.download, name, bad=True)
        return {"success": True}

    async def remove(request: Request):
        name = request.query_params.get("model", "")
        if not name:
            raise invalid("model must be a non-empty string")
        await run_in_threadpool(_call, router.remove, name, bad=True)
        return {"success": True}

    async def props(request: Request):
        if not request.query_params.get("model"):
            return {**_router_props(router), "cors_proxy_enabled": state.options.cors_proxy}
        return await _proxy(request)

    routes: list[tuple[str, Callable, list[str]]] = [
        ("/health", health, ["GET"]),
        ("/v1/health", health, ["GET"]),
        ("/models", models, ["GET"]),
        ("/v1/models", models, ["GET"]),
        ("/models/load", load, ["POST"]),
        ("/models/unload", unload, ["POST"]),
        ("/models/sse", events, ["GET"]),
        ("/models", download, ["POST"]),
        ("/models", remove, ["DELETE"]),
        ("/props", props, ["GET"]),
    ]
    routes += [(p, _proxy, ["POST"]) for p in POST_PATHS] + [
        (p, _proxy, ["GET"]) for p in GET_PATHS
    ]
    for path, endpoint, methods in routes:
        app.add_api_route(prefix + path, endpoint, methods=methods, include_in_schema=False)
    app.include_router(routes_cors_proxy.router, prefix=prefix)  # llama-server's router has it too
    app.include_router(
        vertex.router, prefix=prefix
    )  # AIP_MODE=PREDICTION: /predict, through the router
    install_middleware(app, state)
    return app


def _call(fn, *args, unknown: tuple[int, str] | None = None, bad: bool = False):
    """Router errors as HTTP errors: an unknown model, a model in the wrong state or a preset
    that does not parse is a 400 (`unknown` overrides the unknown-model answer; with `bad`
    every router error is the request's), a full router or a failed load a 503."""
    try:
        return fn(*args)
    except UnknownModelError as e:
        status, message = unknown or (400, str(e))
        raise APIError(status, message) from None
    except RequestCancelled as e:
        raise APIError(499, str(e), "invalid_request_error") from None
    except ModelLimitError as e:
        raise APIError(503, str(e)) from None
    except PresetError as e:  # GET /models?reload=1 over a broken preset: the old list stays
        raise APIError(400, str(e)) from None
    except RouterError as e:
        not_running = bad or "not loaded" in str(e) or "not running" in str(e)
        raise APIError(400 if not_running else 503, str(e)) from None


async def _model_field(request: Request, state) -> str:
    raw = await read_body(request, state.options.max_body_bytes)
    data = load_json(raw) if raw.strip() else {}
    name = data.get("model") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name:
        raise invalid("'model' (a string) is required")
    return name


def _router_props(router: Router) -> dict:
    """GET /props without a model: the router itself (llama-server's dummy model fields keep
    its web UI working)."""
    commit = git_commit() or "ggstation"
    return {
        "role": "router",
        "max_instances": router.models_max,
        "models_autoload": router.autoload,
        "model_alias": "llama-server",
        "model_path": "none",
        "default_generation_settings": {"params": None, "n_ctx": 0},
        "ui_settings": {},
        "build_info": f"b{__version__}-{commit}",
        "cors_proxy_enabled": False,
    }


async def _listing(app: FastAPI) -> list[dict]:
    router: Router = app.state.router
    created = int(time.time())
    out = []
    for m in router.models_info():
        info = m.pop("_loaded_info")
        entry = {
            **m,
            "object": "model",
            "owned_by": "llamacpp",
            "created": created,
            "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
        }
        if m["status"]["value"] in (ModelStatus.LOADED.value, ModelStatus.SLEEPING.value):
            if info is None:
                info = await _child_info(app, router.get(m["id"]))
            for k, v in (info or {}).items():
                entry.setdefault(k, v)
        out.append(entry)
    return out


async def _child_info(app: FastAPI, child: ChildServer) -> dict | None:
    """A loaded model's own /v1/models entry (meta, capabilities), fetched once per load (a
    model that does not answer in time is listed without it, and not asked again)."""
    upstream: Upstream = app.state.upstream
    info = await upstream.model_info(child) or {}
    if child.status in (ModelStatus.LOADED, ModelStatus.SLEEPING):
        child.loaded_info = info
    return info


def _event_stream(router: Router) -> StreamingResponse:
    """GET /models/sse: every model event, as `data: {...}` lines, until the client leaves."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict] = asyncio.Queue()

    def put(msg: dict) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, msg)

    unsubscribe = router.subscribe(put)

    async def gen():
        try:
            while True:
                yield f"data: {json.dumps(await queue.get(), separators=(',', ':'))}\n\n"
        finally:
            unsubscribe()

    return StreamingResponse(gen(), media_type="text/event-stream")


async def _proxy(request: Request):
    router: Router = request.app.state.router
    state = request.app.state.server
    body = b""
    name = request.query_params.get("model", "")
    if request.method == "POST":
        body = await read_body(request, state.options.max_body_bytes)
        data = load_json(body)
        field = data.get("model") if isinstance(data, dict) else None
        name = field if isinstance(field, str) else ""
    if not name:
        raise invalid("model name is missing from the request")
    autoload_param = request.query_params.get("autoload")
    autoload = router.autoload if not autoload_param else autoload_param in ("true", "1")
    child = await _acquire(request, router, name, autoload, touch=request.method == "POST")
    upstream: Upstream = request.app.state.upstream
    try:
        return await upstream.forward(request, child, body, lambda: router.release(child))
    except BaseException:
        router.release(child)
        raise


async def _acquire(
    request: Request, router: Router, name: str, autoload: bool, touch: bool
) -> ChildServer:
    """router.acquire() on a worker thread, cancelled when the client leaves meanwhile."""
    gone = threading.Event()
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            if await request.is_disconnected():
                gone.set()
                return
            try:
                await asyncio.wait_for(done.wait(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                pass

    watcher = asyncio.create_task(watch())
    try:
        # on threads of their own: requests queued for a model must not use up the pool that
        # every other blocking call of the app (load, unload, reload) needs
        return await anyio.to_thread.run_sync(
            lambda: _call(
                lambda: router.acquire(
                    name, autoload=autoload, should_stop=gone.is_set, touch=touch
                )
            ),
            limiter=_waiters(request.app),
        )
    finally:
        done.set()
        await watcher


def _waiters(app: FastAPI) -> anyio.CapacityLimiter:
    limiter = getattr(app.state, "waiters", None)
    if limiter is None:
        limiter = app.state.waiters = anyio.CapacityLimiter(MAX_WAITING)
    return limiter


class HttpUpstream:
    """Each model is a child server on this machine, reached over plain HTTP."""

    def __init__(self) -> None:
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))

    async def health(self) -> dict:
        return {"status": "ok"}

    async def model_info(self, child: ChildServer) -> dict | None:
        try:
            r = await self.client.get(
                child.url + "/v1/models",
                headers={"authorization": f"Bearer {child.api_key}"},
                timeout=INFO_TIMEOUT_S,
            )
            data = r.json().get("data") or [{}]
            return data[0] if isinstance(data[0], dict) else {}
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    async def forward(
        self, request: Request, child: ChildServer, body: bytes, release: Callable[[], None]
    ) -> Response:
        name = child.name
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        headers["authorization"] = f"Bearer {child.api_key}"
        params: list[tuple[str, str | int | float | bool | None]] = [
            (k, v) for k, v in request.query_params.multi_items() if k not in ("model", "autoload")
        ]
        upstream = self.client.build_request(
            request.method,
            child.url + request.url.path,
            params=params,
            headers=headers,
            content=body,
        )
        try:
            resp = await self.client.send(upstream, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise APIError(503, f"model '{name}' is not reachable: {e}") from None
        except httpx.TransportError as e:
            raise await _broken(name, child, e) from None
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            events = relay_events(
                resp.aiter_raw(), httpx.TransportError, lambda e: _broken(name, child, e)
            )
            return Relay(
                events, resp.aclose, release, status_code=resp.status_code, headers=out_headers
            )
        try:  # a plain answer is read whole, so a child that dies half-way is still a clean 502
            content = await resp.aread()
        except httpx.TransportError as e:
            raise await _broken(name, child, e) from None
        finally:
            await resp.aclose()
        release()
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
    why = (
        f"its server exited with code {code}"
        if code is not None
        else f"the connection to its server broke ({e})"
    )
    return APIError(
        502, f"model '{name}' stopped before finishing its answer: {why}", "server_error"
    )


class Relay(StreamingResponse):
    """Streams a model's events; closes the upstream however it ends (`close`), so a client
    that goes away cancels the model's generation too, and then releases the model."""

    def __init__(
        self,
        events: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        release: Callable[[], None],
        **kw,
    ):
        super().__init__(events, **kw)
        self._close = close
        self._release = release

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._close()
            finally:
                self._release()


async def relay_events(
    chunks: AsyncIterator[bytes],
    broken_errors: type[Exception] | tuple[type[Exception], ...],
    broken: Callable[[Exception], Awaitable[APIError]],
) -> AsyncIterator[bytes]:
    """Whole SSE events from the model. If it dies mid-stream (one of `broken_errors`), its
    half event is dropped and an error event ends the stream (as llama-server reports errors
    once streaming), so the client gets a well-formed body instead of a broken chunked read."""
    pending = b""
    try:
        async for chunk in chunks:
            pending += chunk
            cut = pending.rfind(b"\n\n") + 2
            if cut >= 2:
                yield pending[:cut]
                pending = pending[cut:]
    except broken_errors as e:
        yield sse((await broken(e)).body())
        return
    if pending:
        yield pending
