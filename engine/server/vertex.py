"""Vertex AI prediction mode (AIP_MODE=PREDICTION): llama-server's Google Cloud custom-container
protocol, read from the AIP_* environment variables when the app is built.

    AIP_MODE=PREDICTION     turns the mode on
    AIP_HTTP_PORT           the port to listen on, over --port (default 8080)
    AIP_PREDICT_ROUTE       POST route taking {"instances": [...]} (default /predict)
    AIP_HEALTH_ROUTE        GET route answering as /health, with no API key (default: none besides /health)

Each instance names the endpoint it is for in "@requestFormat", as a camelCase alias of a
route's path ("chatCompletions" for /v1/chat/completions, "applyTemplate" for /apply-template)
or as the path itself; the rest of the instance is that endpoint's body. Instances run
concurrently, each through the whole app (the same keys, limits and errors as a direct call),
never streaming; the answer is {"predictions": [one body per instance]}, an instance's error
being its {"error": {...}} body in its place.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..errors import APIError, EngineError
from .bodies import load_json, read_body
from .errors import invalid

MAX_INSTANCES = 128  # llama-server's limit


@dataclass(frozen=True)
class VertexSettings:
    predict_route: str
    health_route: str | None
    port: int


def _route_env(environ: Mapping[str, str], name: str, default: str | None) -> str | None:
    value = environ.get(name) or default
    if value and not value.startswith("/"):
        value = "/" + value
    return value


def settings(environ: Mapping[str, str] = os.environ) -> VertexSettings | None:
    """The prediction-mode settings, or None when AIP_MODE is not PREDICTION.

    Raises:
        EngineError: AIP_HTTP_PORT is not a port number.
    """
    if environ.get("AIP_MODE") != "PREDICTION":
        return None
    raw_port = environ.get("AIP_HTTP_PORT") or "8080"
    try:
        port = int(raw_port)
    except ValueError:
        raise EngineError(f"AIP_HTTP_PORT must be a port number, got {raw_port!r}") from None
    if not 0 <= port <= 65535:
        raise EngineError(f"AIP_HTTP_PORT must be 0..65535, got {port}")
    return VertexSettings(
        predict_route=_route_env(environ, "AIP_PREDICT_ROUTE", "/predict") or "/predict",
        health_route=_route_env(environ, "AIP_HEALTH_ROUTE", None),
        port=port,
    )


def health_route(environ: Mapping[str, str] = os.environ) -> str | None:
    """AIP_HEALTH_ROUTE in prediction mode (the gate lets it through without an API key, as
    /health: Vertex AI's probes carry none); None otherwise."""
    try:
        s = settings(environ)
    except EngineError:  # a bad AIP_HTTP_PORT: `ggstation serve` refuses it before listening
        return None
    return s.health_route if s is not None else None


def listen_port(port: int, environ: Mapping[str, str] = os.environ) -> int:
    """The port to listen on: AIP_HTTP_PORT in prediction mode (over --port, as llama-server)."""
    s = settings(environ)
    return port if s is None else s.port


def gcp_format(path: str) -> str:
    """A route's @requestFormat alias: without /v1, camelCase at '/', '-' and '_', up to its
    first path parameter ("/v1/chat/completions" -> "chatCompletions")."""
    if path.startswith("/v1"):
        path = path[3:]
    out, cap = [], False
    for c in path.lstrip("/"):
        if c in ":{":
            break
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


class _PredictionRouter(APIRouter):
    """An APIRouter whose routes are those AIP_* asks for (none outside prediction mode),
    read from the environment whenever the app looks at them, so an app built after the
    variables are set serves them without a change to the app factory."""

    _built: dict[VertexSettings, list[BaseRoute]] = {}

    @property
    def routes(self) -> list[BaseRoute]:
        try:
            s = settings()
        except EngineError:  # a bad AIP_HTTP_PORT: `ggstation serve` refuses it before listening
            return []
        if s is None:
            return []
        if s not in self._built:
            built = APIRouter()
            built.add_api_route(s.predict_route, predict, methods=["POST"])
            if s.health_route:
                built.add_api_route(s.health_route, health, methods=["GET"])
            self._built[s] = built.routes
        return self._built[s]

    @routes.setter
    def routes(self, value: list[BaseRoute]) -> None:
        pass  # APIRouter.__init__ sets an empty list; the routes come from the environment


router = _PredictionRouter()


# -- the routes ------------------------------------------------------------------------------


def _prefix(request: Request) -> str:
    return request.app.state.server.options.api_prefix.rstrip("/")


async def health(request: Request) -> Response:
    status, body, content_type = await _call(request, "GET", _prefix(request) + "/health", None)
    return Response(body, status_code=status, media_type=content_type)


async def predict(request: Request) -> JSONResponse:
    raw = await read_body(request, request.app.state.server.options.max_body_bytes)
    data = load_json(raw) if raw.strip() else None
    if not isinstance(data, dict):
        raise invalid("request body must be a JSON object")
    instances = data.get("instances")
    if not isinstance(instances, list):
        raise invalid("request body must include an array field named instances")
    if len(instances) > MAX_INSTANCES:
        raise invalid(f"instances array exceeds maximum size of {MAX_INSTANCES}")
    targets = _targets(request)
    predictions = await asyncio.gather(
        *(_predict_one(request, targets, inst) for inst in instances)
    )
    return JSONResponse({"predictions": list(predictions)})


def _app_routes(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, set[str]]]:
    """(full path, methods) of every route, through included routers (FastAPI >= 0.165 keeps
    them as wrappers around the original router; older versions copy the routes)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            context = getattr(route, "include_context", None)
            yield from _app_routes(inner.routes, prefix + getattr(context, "prefix", ""))
        elif isinstance(route, Route) and route.methods:
            yield prefix + route.path, route.methods


def _targets(request: Request) -> dict[str, tuple[str, str]]:
    """@requestFormat (alias or path) -> (method, full path) of every route of the app."""
    prefix = _prefix(request)
    s = settings()
    own = {s.predict_route, s.health_route} if s is not None else set()
    aliases: dict[str, tuple[str, str]] = {}
    paths: dict[str, tuple[str, str]] = {}
    for full, methods in _app_routes(request.app.router.routes):
        path = full[len(prefix) :] if prefix and full.startswith(prefix) else full
        method = next((m for m in ("POST", "GET", "DELETE") if m in methods), None)
        if path in own or method is None:
            continue
        paths.setdefault(path, (method, full))
        aliases.setdefault(gcp_format(path), (method, full))  # the first route wins
    return {**aliases, **paths}


def _error(status: int, message: str) -> dict:
    return APIError(status, message).body()


async def _predict_one(request: Request, targets: dict[str, tuple[str, str]], instance: Any) -> Any:
    if not isinstance(instance, dict):
        return _error(400, "each instance must be a JSON object")
    fmt = instance.get("@requestFormat")
    if not isinstance(fmt, str):
        return _error(400, "each instance must include a string @requestFormat")
    target = targets.get(fmt)
    if target is None:
        return _error(400, f"no handler registered for @requestFormat: {fmt}")
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    if "stream" in payload:  # the predict route answers in one piece
        payload["stream"] = False
    method, path = target
    body = json.dumps(payload, ensure_ascii=False).encode()
    try:
        status, raw, content_type = await _call(request, method, path, body)
    except Exception as e:  # noqa: BLE001 - one instance's failure is its prediction, not the request's
        return _error(500, f"{type(e).__name__}: {e}")
    if content_type.startswith("text/event-stream"):
        return _error(400, "predict route does not support streaming responses")
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


_DROPPED_HEADERS = {
    b"content-length",
    b"content-type",
    b"transfer-encoding",
    b"accept-encoding",
    b"expect",
}


async def _call(
    request: Request, method: str, path: str, body: bytes | None
) -> tuple[int, bytes, str]:
    """Run one request through the whole app in-process: (status, body, content type)."""
    headers = [(k, v) for k, v in request.scope["headers"] if k.lower() not in _DROPPED_HEADERS]
    if body is not None:
        headers += [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
    scope = {
        k: v
        for k, v in request.scope.items()
        if k
        in (
            "type",
            "asgi",
            "http_version",
            "scheme",
            "server",
            "client",
            "root_path",
            "state",
            "extensions",
        )
    }
    scope.update(
        method=method, path=path, raw_path=path.encode(), query_string=b"", headers=headers
    )
    sent = False
    status, content_type, chunks = 500, "", []

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body or b"", "more_body": False}
        await asyncio.Event().wait()  # nothing more; a disconnect check is cancelled here
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal status, content_type
        if message["type"] == "http.response.start":
            status = message["status"]
            for k, v in message.get("headers", ()):
                if k.lower() == b"content-type":
                    content_type = v.decode("latin-1")
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await request.app(scope, receive, send)
    return status, b"".join(chunks), content_type
