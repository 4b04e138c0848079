"""/cors-proxy: llama-server's experimental proxy for its web UI's MCP client (--ui-mcp-proxy).

A page cannot call an MCP server on another origin that sends no CORS headers, so the web UI
asks this server to make the request (GET or POST to `?url=`). Only the headers the page names
explicitly, as `x-llama-server-proxy-header-NAME: value`, are sent on: this request's cookies,
API key and proxy credentials never leave the server. Disabled, as by default, both methods
answer 403 "this feature is disabled". The API key is checked first, as on every route.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
from fastapi import APIRouter, Request
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import APIError
from .bodies import read_body
from .errors import invalid
from .routing import server_state

router = APIRouter()

HEADER_PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600.0  # llama-server's: ten minutes each way
# not sent on: the body is re-framed here, and the answer must come uncompressed
_REQUEST_DROP = {"accept-encoding", "transfer-encoding", "content-length", "host", "connection"}
# not passed back: framing is this server's own, and CORS headers are its own (http.py)
_RESPONSE_DROP = {"server", "transfer-encoding", "content-length", "keep-alive", "connection",
                  "content-encoding", "content-type", "date"}


@router.api_route("/cors-proxy", methods=["GET", "POST"], include_in_schema=False)
async def cors_proxy(request: Request) -> Response:
    s = server_state(request)
    if not s.options.cors_proxy:
        return JSONResponse({"error": {"message": "this feature is disabled", "type": "feature_disabled"}},
                            status_code=403)
    url = target_url(request.query_params.get("url", ""))
    headers = forwarded_headers(request.headers.items())
    headers["accept-encoding"] = "identity"
    body = await read_body(request, s.options.max_body_bytes) if request.method == "POST" else b""
    client = httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S), follow_redirects=True)
    try:
        upstream = await client.send(client.build_request(request.method, url, headers=headers, content=body),
                                     stream=True)
    except httpx.HTTPError as e:
        await client.aclose()
        raise APIError(502, f"proxy error: {type(e).__name__}: {e}", "server_error") from None
    out_headers = {k: v for k, v in upstream.headers.items()
                   if k.lower() not in _RESPONSE_DROP and not k.lower().startswith("access-control-")}
    media_type = upstream.headers.get("content-type")

    async def close() -> None:
        await upstream.aclose()
        await client.aclose()

    if upstream.status_code in (204, 304):  # no body may follow
        await close()
        return Response(status_code=upstream.status_code, headers=out_headers)
    return StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code, headers=out_headers,
                             media_type=media_type, background=BackgroundTask(close))


def target_url(url: str) -> str:
    """The `url` query parameter, checked as llama-server does.

    Raises:
        APIError: 400 naming what is wrong with it.
    """
    if not url:
        raise invalid("the 'url' query parameter is required")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        password = parts.password
    except ValueError as e:
        raise invalid(f"invalid target URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise invalid(f"unsupported URL scheme in target URL: {parts.scheme or '(none)'}")
    if not host:
        raise invalid("invalid target URL: missing host")
    if password:
        raise invalid("authentication in target URL is not supported")
    return url


def forwarded_headers(items) -> dict[str, str]:
    """x-llama-server-proxy-header-NAME: value -> NAME: value; every other header is dropped."""
    out = {}
    for key, value in items:
        name = key.lower()
        if name.startswith(HEADER_PREFIX) and len(name) > len(HEADER_PREFIX):
            name = name[len(HEADER_PREFIX):]
            if name not in _REQUEST_DROP:
                out[name] = value
    return out
