"""/cors-proxy: llama-server's experimental proxy for its web UI's MCP client (--ui-mcp-proxy).

A page cannot call an MCP server on another origin that sends no CORS headers, so the web UI
asks this server to make the request (GET or POST to `?url=`). Only the headers the page names
explicitly, as `x-llama-server-proxy-header-NAME: value`, are sent on: this request's cookies,
API key and proxy credentials never leave the server. Disabled, as by default, both methods
answer 403 "this feature is disabled". The API key is checked first, as on every route.

Stricter than llama-server, which answers any page (its CORS echoes every Origin): a proxy
that fetches from this machine would let any site a browser opens read the services on
127.0.0.1. So only this server's own pages may use it, or origins named in --cors-origins
('*' and 'localhost' name none); everything else is a 403 without a CORS header, preflights
included (`cross_origin_refusal`, applied by the gate in http.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

import httpx
from fastapi import APIRouter, Request
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import APIError
from .bodies import read_body
from .errors import invalid
from .routing import server_state
from .state import ServerOptions

router = APIRouter()

PATH = "/cors-proxy"
HEADER_PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600.0  # llama-server's: ten minutes each way
# not sent on: the body is re-framed here, and the answer must come uncompressed
_REQUEST_DROP = {"accept-encoding", "transfer-encoding", "content-length", "host", "connection"}
# not passed back: framing is this server's own, and CORS headers are its own (http.py)
_RESPONSE_DROP = {
    "server",
    "transfer-encoding",
    "content-length",
    "keep-alive",
    "connection",
    "content-encoding",
    "content-type",
    "date",
}
_DEFAULT_PORTS = {"http": 80, "https": 443}


@router.api_route(PATH, methods=["GET", "POST"], include_in_schema=False)
async def cors_proxy(request: Request) -> Response:
    s = server_state(request)
    if not s.options.cors_proxy:
        return JSONResponse(
            {"error": {"message": "this feature is disabled", "type": "feature_disabled"}},
            status_code=403,
        )
    url = target_url(request.query_params.get("url", ""))
    headers = forwarded_headers(request.headers.items())
    headers["accept-encoding"] = "identity"
    body = await read_body(request, s.options.max_body_bytes) if request.method == "POST" else b""
    client = httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S), follow_redirects=True)
    try:
        outgoing = client.build_request(request.method, url, headers=headers, content=body)
    except (httpx.InvalidURL, ValueError, TypeError) as e:  # UnicodeError is a ValueError
        await client.aclose()
        raise invalid(f"invalid target URL or proxied header: {e}") from None
    try:
        upstream = await client.send(outgoing, stream=True)
    except Exception as e:  # noqa: BLE001 - whatever reaching the target raised (a redirect to a bad
        # URL is httpx.InvalidURL, a bad port deep in anyio an ExceptionGroup) is the target's failure
        await client.aclose()
        raise APIError(502, f"proxy error: {type(e).__name__}: {e}", "server_error") from None
    out_headers = {
        k: v
        for k, v in upstream.headers.items()
        if k.lower() not in _RESPONSE_DROP and not k.lower().startswith("access-control-")
    }
    media_type = upstream.headers.get("content-type")

    async def close() -> None:
        await upstream.aclose()
        await client.aclose()

    if upstream.status_code in (204, 304):  # no body may follow
        await close()
        return Response(status_code=upstream.status_code, headers=out_headers)
    return StreamingResponse(
        upstream.aiter_raw(),
        status_code=upstream.status_code,
        headers=out_headers,
        media_type=media_type,
        background=BackgroundTask(close),
    )


def target_url(url: str) -> str:
    """The `url` query parameter, checked as llama-server does and as the HTTP client will
    parse it (port range, control characters, IDNA, IPv4 forms), so that nothing it cannot
    use reaches it.

    Raises:
        APIError: 400 naming what is wrong with it.
    """
    if not url:
        raise invalid("the 'url' query parameter is required")
    bad = next((c for c in url if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F), None)
    if bad is not None:  # a CR/LF would split the request line it is sent in
        raise invalid(f"invalid target URL: control character {bad!r}")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        password = parts.password
        port = parts.port
    except ValueError as e:
        raise invalid(f"invalid target URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise invalid(f"unsupported URL scheme in target URL: {parts.scheme or '(none)'}")
    if not host:
        raise invalid("invalid target URL: missing host")
    if any(c.isspace() for c in parts.netloc):
        raise invalid("invalid target URL: whitespace in the host")
    if password:
        raise invalid("authentication in target URL is not supported")
    if port == 0:
        raise invalid("invalid target URL: port 0")
    try:
        httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as e:  # IDNA (a UnicodeError), 0177.0.0.1, ...
        message = str(e)
        if "idna" in message.lower() or isinstance(e, UnicodeError):
            message = f"cannot encode the host as IDNA: {message}"
        raise invalid(f"invalid target URL: {message}") from None
    return url


def forwarded_headers(items) -> dict[str, str]:
    """x-llama-server-proxy-header-NAME: value -> NAME: value; every other header is dropped."""
    out = {}
    for key, value in items:
        name = key.lower()
        if name.startswith(HEADER_PREFIX) and len(name) > len(HEADER_PREFIX):
            name = name[len(HEADER_PREFIX) :]
            if name not in _REQUEST_DROP:
                out[name] = value
    return out


# -- who may use it ---------------------------------------------------------------------------


def cross_origin_refusal(
    opts: ServerOptions, scheme: str, headers: Mapping[str, str]
) -> APIError | None:
    """None when this request may use the proxy, else the 403 to answer.

    Allowed: an Origin named in --cors-origins; otherwise a request from this server's own
    origin: no Origin or one equal to scheme://Host, no Fetch Metadata saying another site
    sent it (a no-cors <img> GET carries no Origin), and a Host that names this machine (an
    IP address or localhost), since a DNS name can be rebound to 127.0.0.1 by a foreign page.

    Args:
        opts: the server's options (cors_origins is read).
        scheme: the request's scheme ("http" or "https").
        headers: the request's headers, names in lower case.
    """
    origin = headers.get("origin")
    listed = [o for o in opts.cors_origins if o not in ("*", "localhost")]
    listed_keys = {k for k in map(_origin_key, listed) if k is not None}
    if origin is not None and (origin in listed or _origin_key(origin) in listed_keys):
        return None
    host = _host_key(scheme, headers.get("host"))
    if origin is not None and (host is None or _origin_key(origin) != host):
        return _refused(f"a page from {origin} is not this server's own")
    site = headers.get("sec-fetch-site", "").lower()
    if site in ("cross-site", "same-site"):
        return _refused(f"the browser says a {site} page sent it")
    if host is None:
        return _refused("the request names no Host")
    if not _names_this_machine(host[1]) and host[1] not in {k[1] for k in listed_keys}:
        return _refused(f"the Host {host[1]} is a name, not this machine's address")
    return None


def _refused(why: str) -> APIError:
    return APIError(
        403,
        f"{PATH} answers only this server's own pages and the origins named in "
        f"--cors-origins: {why}; to allow a page, add its origin to --cors-origins",
    )


def _origin_key(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin or base URL; None if it is not one."""
    try:
        parts = urlsplit(origin.strip())
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    return scheme, host.lower(), port if port is not None else _DEFAULT_PORTS[scheme]


def _host_key(scheme: str, host: str | None) -> tuple[str, str, int] | None:
    if not host or any(c in host for c in "/?#@") or any(c.isspace() for c in host):
        return None
    return _origin_key(f"{scheme}://{host}")


def _names_this_machine(host: str) -> bool:
    """An IP address or localhost: names no foreign page can make its own (browsers resolve
    *.localhost to loopback themselves)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
