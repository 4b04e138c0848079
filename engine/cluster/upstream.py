"""RayUpstream: the router app reaches a model through its Serve deployment handle.

A request is forwarded as it came (method, path, query, headers, body) to a replica's
`handle_request`, streamed (`handle.options(stream=True)`): the first item is the response
head, then every chunk the replica's app sent. An event stream is relayed event by event
(proxy.relay_events), and a replica that dies mid-stream ends it with an error event; Serve
starts a new replica meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from starlette.responses import Response

from ..errors import APIError
from ..router.proxy import HOP_HEADERS, Relay, relay_events
from ..router.supervisor import ChildServer
from .plan import DEPLOYMENT, app_name
from .replica import ForwardedRequest, ResponseHead
from .router import RayRouter

INFO_TIMEOUT_S = 5.0


def _errors() -> tuple[type[Exception], ...]:
    """What a replica that died, or a handle that found none, raises."""
    from ray.exceptions import RayError
    from ray.serve.exceptions import RayServeException

    return (RayError, RayServeException)


class RayUpstream:
    def __init__(self, router: RayRouter):
        self.router = router

    def _stream(self, model: str, req: ForwardedRequest):
        from ray import serve

        handle = serve.get_deployment_handle(DEPLOYMENT, app_name=app_name(model))
        return handle.options(stream=True).handle_request.remote(req)

    async def health(self) -> dict:
        from starlette.concurrency import run_in_threadpool

        return {"status": "ok", "cluster": await run_in_threadpool(self.router.cluster_view)}

    async def model_info(self, child: ChildServer) -> dict | None:
        import asyncio

        errors: tuple[type[Exception], ...] = (
            asyncio.TimeoutError,
            ValueError,
            AttributeError,
            *_errors(),
        )
        try:
            head, content = await asyncio.wait_for(
                self._read(child.name, ForwardedRequest("GET", "/v1/models", b"", (), b"")),
                INFO_TIMEOUT_S,
            )
            data = json.loads(content).get("data") or [{}]
            return data[0] if isinstance(data[0], dict) else {}
        except errors:
            return None

    async def _read(self, model: str, req: ForwardedRequest) -> tuple[ResponseHead, bytes]:
        gen = self._stream(model, req)
        head = await gen.__anext__()
        return head, b"".join([chunk async for chunk in gen])

    async def forward(
        self, request: Request, child: ChildServer, body: bytes, release: Callable[[], None]
    ) -> Response:
        name = child.name
        query = "&".join(
            f"{k}={v}"
            for k, v in request.query_params.multi_items()
            if k not in ("model", "autoload")
        )
        headers = tuple(
            (k, v) for k, v in request.headers.raw if k.decode("latin-1").lower() not in HOP_HEADERS
        )
        gen = self._stream(
            name, ForwardedRequest(request.method, request.url.path, query.encode(), headers, body)
        )
        errors = _errors()
        try:
            head = await gen.__anext__()
        except StopAsyncIteration:
            raise APIError(502, f"model '{name}' sent no answer", "server_error") from None
        except errors as e:
            raise APIError(503, f"model '{name}' is not reachable: {_why(e)}") from None
        assert isinstance(head, ResponseHead)  # the replica's protocol: its head comes first
        out_headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in head.headers
            if k.decode("latin-1").lower() not in HOP_HEADERS
        }
        if head.content_type.startswith("text/event-stream"):

            async def broken(e: Exception) -> APIError:
                return _broken(name, e)

            async def close() -> None:
                gen.cancel()

            return Relay(
                relay_events(_chunks(gen), errors, broken),
                close,
                release,
                status_code=head.status,
                headers=out_headers,
            )
        try:
            content = b"".join([chunk async for chunk in _chunks(gen)])
        except errors as e:
            raise _broken(name, e) from None
        finally:
            release()
        return Response(content, status_code=head.status, headers=out_headers)


async def _chunks(gen) -> AsyncIterator[bytes]:
    async for chunk in gen:
        assert isinstance(chunk, bytes)  # after the head, the replica sends body chunks only
        yield chunk


def _broken(name: str, e: Exception) -> APIError:
    return APIError(
        502,
        f"model '{name}' stopped before finishing its answer: its replica failed ({_why(e)}); "
        "Ray Serve starts a new one",
        "server_error",
    )


def _why(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}".rstrip(": ")
