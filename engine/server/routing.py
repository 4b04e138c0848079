"""What every route module shares: the server state of a request, submitting to the scheduler,
consuming a request's items while watching for the client to leave, SSE responses, and the
request-body schemas the OpenAPI document names.
"""

from __future__ import annotations

import asyncio

from fastapi import Request
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.responses import Response, StreamingResponse

from .errors import api_error

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# Bodies are parsed by hand (parse_body), so FastAPI does not know them: each route names its
# model in openapi_extra, and with_body_schemas() puts the models under components/schemas.
# A model's own schema cannot be inlined there: its $refs ("#/$defs/ChatMessage") would
# point into the OpenAPI document's root, where there is no $defs.
_BODY_MODELS: dict[str, type[BaseModel]] = {}


def body_schema(model: type[BaseModel]) -> dict:
    _BODY_MODELS[model.__name__] = model
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def with_body_schemas(spec: dict) -> dict:
    """`spec` with the request-body models, and the models they use, in components/schemas."""
    _, defs = models_json_schema(
        [(m, "validation") for m in _BODY_MODELS.values()],
        ref_template="#/components/schemas/{model}",
    )
    spec.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
    return spec


def server_state(request: Request):
    return request.app.state.server


def submit(s, req):
    try:
        return s.scheduler.submit(req)
    except Exception as e:
        raise api_error(e) from None


def client_gone() -> Response:
    """The answer to a client that went away: nobody reads it, but returning one (rather than
    raising) keeps uvicorn from logging a disconnect as an error, and the request log shows
    nginx's "client closed request" code."""
    return Response(status_code=499)


async def collect(request: Request, handle, on_item) -> bool:
    """Consume a request's items; False (the request cancelled) if the client went away."""

    async def consume():
        async for item in handle.astream():
            on_item(item)

    task = asyncio.ensure_future(consume())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                break
            if await request.is_disconnected():
                handle.cancel()
                return False
    finally:
        if not task.done():
            task.cancel()
    task.result()
    return True


class EventStream(StreamingResponse):
    """text/event-stream whose `on_close` runs however the response ends (client gone too)."""

    def __init__(self, content, on_close, **kw):
        super().__init__(content, media_type="text/event-stream", **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
