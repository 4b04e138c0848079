"""A client of remote OpenAI-compatible servers: another ggstation, a Ray deployment,
llama-server, vLLM, or anything that answers /v1/models and /v1/chat/completions.

    ep = RemoteEndpoint("http://gpu-box:8080", api_key="...")
    with RemoteClient(ep) as client:
        models = client.list_models()          # GET /v1/models
        info = client.probe()                  # GET /props: llama-server/ggstation or plain OpenAI
        slots = client.slots()                 # GET /slots   (when info.has_slots)
        load = client.metrics()                # GET /metrics (when info.has_metrics)
    for delta in stream_chat(ep, "model-id", messages, RemoteSampling(), info):
        ...                                    # POST /v1/chat/completions, stream=true (SSE)

Every failure is a RemoteError naming the endpoint, with a `reason` (unreachable, timeout, auth,
not_openai, not_found, broken, server). Every request has a bounded timeout: a dead host or a
server that stops sending ends in an error, never a hang. ChatStream.cancel() may be called from
any thread: it shuts the socket down, which wakes the reading thread at once and tells the
server the client left (llama-server and ggstation then cancel the generation).

Qt-free; the app calls it from worker threads (app/remote_adapter.py).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from .errors import RemoteError

CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 10.0  # listing, probing and polling
# a streaming reply may be silent while the server reads a long prompt on a slow machine
STREAM_READ_TIMEOUT_S = 300.0
KIND_OPENAI, KIND_LLAMA, KIND_GGSTATION = "openai", "llama-server", "ggstation"


@dataclass(frozen=True)
class RemoteEndpoint:
    """Where a server is. `url` is the base (scheme, host, port, optional path), without /v1."""

    url: str
    api_key: str = ""
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or self.url


@dataclass(frozen=True)
class RemoteModel:
    id: str
    owned_by: str = ""
    n_ctx: int = 0  # 0: the listing did not say


@dataclass(frozen=True)
class ServerInfo:
    """What GET /props says about a server; kind KIND_OPENAI when it has no /props."""

    kind: str = KIND_OPENAI
    n_ctx: int = 0  # per slot; 0: not known
    total_slots: int = 0
    has_slots: bool = False
    has_metrics: bool = False
    build_info: str = ""

    @property
    def llama_like(self) -> bool:
        """Speaks llama-server's dialect: accepts top_k, min_p, repeat_penalty, returns timings."""
        return self.kind != KIND_OPENAI


@dataclass(frozen=True)
class RemoteSlot:
    """One entry of llama-server's GET /slots."""

    id: int
    n_ctx: int
    is_processing: bool
    n_prompt_tokens: int = 0
    n_decoded: int = 0


@dataclass(frozen=True)
class RemoteMetrics:
    """The llamacpp:* counters and gauges of GET /metrics (Prometheus text); 0 when absent."""

    prompt_tokens_total: float = 0.0
    tokens_predicted_total: float = 0.0
    tokens_predicted_seconds_total: float = 0.0
    predicted_tokens_seconds: float = 0.0  # tokens/s since the previous scrape
    requests_processing: float = 0.0
    requests_deferred: float = 0.0


@dataclass(frozen=True)
class RemoteSampling:
    """The request's sampling fields. The first five are OpenAI's; the rest are llama-server's
    extensions, sent only to a server that speaks them (ServerInfo.llama_like)."""

    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None


@dataclass(frozen=True)
class ChatDelta:
    """One piece of a streamed reply. The counts grow as the reply does; the server's usage and
    timings replace the client's estimates (one chunk = one token, time from the request) on
    the last delta, the one with a finish_reason."""

    text: str
    finish_reason: str | None
    n_prompt: int = 0
    n_generated: int = 0
    n_cached: int = 0
    t_prompt_ms: float = 0.0
    t_gen_ms: float = 0.0


def normalize_url(text: str) -> str:
    """The endpoint's base URL from what a user typed: `host:port` gets http://, a trailing
    `/` or `/v1` goes. Raises RemoteError(BAD_URL) when it is not an http(s) address."""
    raw = text.strip()
    if raw and "://" not in raw:
        raw = "http://" + raw
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as e:
        raise RemoteError(
            f"{text.strip()!r} is not a valid URL: {e}", RemoteError.BAD_URL
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in raw:
        raise RemoteError(
            f"{text.strip()!r} is not an http(s) URL (example: http://192.168.1.20:8080)",
            RemoteError.BAD_URL,
        )
    path = parts.path.rstrip("/").removesuffix("/v1")
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class RemoteClient:
    """One connection pool to one endpoint, for short requests (list, probe, poll).
    Thread-safe; close() it (or use it as a context manager) when done."""

    def __init__(self, endpoint: RemoteEndpoint, timeout_s: float = REQUEST_TIMEOUT_S):
        self.endpoint = endpoint
        self._http = httpx.Client(
            headers=_headers(endpoint),
            follow_redirects=True,
            timeout=httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)),
        )

    def __enter__(self) -> RemoteClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def list_models(self) -> list[RemoteModel]:
        """GET /v1/models. Raises RemoteError(NOT_OPENAI) when the answer is not a model list."""
        data = self._get_json("/v1/models")
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list) or not all(
            isinstance(m, dict) and isinstance(m.get("id"), str) for m in items
        ):
            raise _not_openai(
                self.endpoint, "/v1/models", "it has no 'data' list of models with an 'id'"
            )
        return [RemoteModel(m["id"], str(m.get("owned_by") or ""), _model_n_ctx(m)) for m in items]

    def probe(self) -> ServerInfo:
        """GET /props: a llama-server or ggstation describes itself there; any other server
        (404, not JSON, an error) is taken for plain OpenAI. A refused key is still an error."""
        try:
            props = self._get_json("/props")
        except RemoteError as e:
            if e.reason in (RemoteError.AUTH, RemoteError.UNREACHABLE, RemoteError.TIMEOUT):
                raise
            return ServerInfo()
        if not isinstance(props, dict) or "default_generation_settings" not in props:
            return ServerInfo()
        settings = props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx", 0) if isinstance(settings, dict) else 0
        build = str(props.get("build_info") or "")
        kind = KIND_GGSTATION if build.startswith("ggstation") else KIND_LLAMA
        if props.get("role") == "router":  # its /slots and /metrics are per model (?model=)
            return ServerInfo(kind=kind, build_info=build)
        return ServerInfo(
            kind=kind,
            n_ctx=_int(n_ctx),
            total_slots=_int(props.get("total_slots", 0)),
            # llama-server has served /slots by default since 2025 and /metrics only with --metrics
            has_slots=bool(props.get("endpoint_slots", True)),
            has_metrics=bool(props.get("endpoint_metrics", False)),
            build_info=build,
        )

    def slots(self) -> list[RemoteSlot]:
        """GET /slots (llama-server's shape)."""
        data = self._get_json("/slots")
        if not isinstance(data, list) or not all(isinstance(s, dict) for s in data):
            raise _not_openai(self.endpoint, "/slots", "it is not a list of slots")
        return [_slot(s) for s in data]

    def metrics(self) -> RemoteMetrics:
        """GET /metrics (Prometheus text with llama-server's llamacpp:* names)."""
        resp = self._request("/metrics")
        return parse_metrics(resp.text)

    def _get_json(self, path: str) -> Any:
        resp = self._request(path)
        try:
            return resp.json()
        except ValueError:
            raise _not_openai(self.endpoint, path, "the answer is not JSON") from None

    def _request(self, path: str) -> httpx.Response:
        try:
            resp = self._http.get(self.endpoint.url + path)
        except httpx.HTTPError as e:
            raise _transport_error(self.endpoint, e) from None
        if resp.status_code >= 400:
            raise _status_error(self.endpoint, path, resp.status_code, resp.text)
        return resp


class ChatStream:
    """A streamed chat completion: iterate it once (from one thread) for ChatDeltas; cancel()
    from any thread closes the connection, which ends the iteration without an error."""

    def __init__(
        self, endpoint: RemoteEndpoint, body: dict, read_timeout_s: float = STREAM_READ_TIMEOUT_S
    ):
        self.endpoint, self.body = endpoint, body
        self._timeout = httpx.Timeout(
            read_timeout_s, connect=CONNECT_TIMEOUT_S, write=REQUEST_TIMEOUT_S
        )
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._http: httpx.Client | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Thread-safe and idempotent. Shutting the socket down wakes a read blocked in another
        thread (closing it would not) and sends the server a FIN: it stops generating."""
        self._cancelled.set()
        with self._lock:
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def __iter__(self) -> Iterator[ChatDelta]:
        if self._cancelled.is_set():
            return
        self._http = httpx.Client(
            headers=_headers(self.endpoint), timeout=self._timeout, follow_redirects=True
        )
        try:
            yield from self._run()
        finally:
            self._http.close()

    def _run(self) -> Iterator[ChatDelta]:
        assert self._http is not None
        url = self.endpoint.url + "/v1/chat/completions"
        acc = _Accumulator(time.perf_counter())
        try:
            with self._http.stream(
                "POST", url, json=self.body, extensions={"trace": self._trace}
            ) as resp:
                if resp.status_code >= 400:
                    raise _status_error(
                        self.endpoint,
                        "/v1/chat/completions",
                        resp.status_code,
                        resp.read().decode("utf-8", "replace"),
                    )
                acc.started = True
                if "text/event-stream" not in resp.headers.get("content-type", ""):
                    yield from acc.whole(resp.read(), self.endpoint)  # the server did not stream
                    return
                for line in resp.iter_lines():
                    if self._cancelled.is_set():
                        return
                    delta = acc.feed_line(line, self.endpoint)
                    if delta is not None:
                        yield delta
                    if acc.done:
                        break
        except httpx.HTTPError as e:
            if self._cancelled.is_set():
                return
            if isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError)) and acc.started:
                raise _broken(self.endpoint) from None
            raise _transport_error(self.endpoint, e) from None
        if self._cancelled.is_set():
            return
        if acc.finish_reason is None:
            raise _broken(self.endpoint)
        yield acc.final()

    def _trace(self, event: str, info: dict) -> None:
        """httpcore's trace hook: keeps the socket as soon as it is connected (and again once
        TLS wraps it), so that cancel() also works while the server has not answered yet."""
        if event not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            self._sock = sock
        if self._cancelled.is_set():  # cancelled while connecting
            self.cancel()


class _Accumulator:
    """Reads SSE lines of chat.completion.chunk objects into ChatDeltas."""

    def __init__(self, t0: float):
        self.t0, self.t_first = t0, 0.0
        self.n_chunks = 0
        self.finish_reason: str | None = None
        self.usage: dict = {}
        self.timings: dict = {}
        self.done = False
        self.started = False  # the server answered 200: a break now is a broken reply

    def feed_line(self, line: str, ep: RemoteEndpoint) -> ChatDelta | None:
        if line.startswith("error:"):  # llama-server's way of failing a stream
            raise _server_error(ep, "/v1/chat/completions", line[len("error:") :].strip())
        if not line.startswith("data:"):
            return None  # blank separators, comments (":"), event names
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            self.done = True
            return None
        try:
            obj = json.loads(payload)
        except ValueError:
            raise _not_openai(ep, "/v1/chat/completions", "a streamed chunk is not JSON") from None
        if not isinstance(obj, dict):
            raise _not_openai(ep, "/v1/chat/completions", "a streamed chunk is not an object")
        if "error" in obj:
            raise _server_error(ep, "/v1/chat/completions", json.dumps(obj))
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        if isinstance(obj.get("timings"), dict):
            self.timings = obj["timings"]
        return self._choice(obj, ep)

    def _choice(self, obj: dict, ep: RemoteEndpoint) -> ChatDelta | None:
        choices = obj.get("choices")
        if not isinstance(choices, list):
            raise _not_openai(ep, "/v1/chat/completions", "a streamed chunk has no 'choices'")
        if not choices:
            return None  # the usage chunk
        choice = choices[0] if isinstance(choices[0], dict) else {}
        delta = _dict(choice.get("delta"))
        text = delta.get("content") if isinstance(delta.get("content"), str) else ""
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        if not text:
            return None
        now = time.perf_counter()
        if not self.n_chunks:
            self.t_first = now
        self.n_chunks += 1
        return ChatDelta(
            text,
            None,
            n_generated=self.n_chunks,
            t_prompt_ms=(self.t_first - self.t0) * 1000.0,
            t_gen_ms=(now - self.t_first) * 1000.0,
        )

    def whole(self, body: bytes, ep: RemoteEndpoint) -> Iterator[ChatDelta]:
        """A chat.completion sent in one piece, as some servers answer stream=true."""
        try:
            obj = json.loads(body)
            message = obj["choices"][0]["message"]
            text = message.get("content") or ""
            self.finish_reason = str(obj["choices"][0].get("finish_reason") or "stop")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _not_openai(
                ep, "/v1/chat/completions", "the answer is not JSON or not an event stream"
            ) from None
        self.usage = _dict(obj.get("usage"))
        self.t_first = time.perf_counter()
        if text:
            self.n_chunks = 1
            yield ChatDelta(
                str(text), None, n_generated=1, t_prompt_ms=(self.t_first - self.t0) * 1000.0
            )
        yield self.final()

    def final(self) -> ChatDelta:
        """The finishing delta, with the server's counts where it sent them."""
        now = time.perf_counter()
        t_first = self.t_first or now
        u, t = self.usage, self.timings
        details = _dict(u.get("prompt_tokens_details"))
        return ChatDelta(
            "",
            self.finish_reason,
            n_prompt=_int(u.get("prompt_tokens", t.get("prompt_n", 0))),
            n_generated=_int(u.get("completion_tokens", t.get("predicted_n", self.n_chunks))),
            n_cached=_int(t.get("cache_n", details.get("cached_tokens", 0))),
            t_prompt_ms=_float(t.get("prompt_ms", (t_first - self.t0) * 1000.0)),
            t_gen_ms=_float(t.get("predicted_ms", (now - t_first) * 1000.0)),
        )


def chat_body(
    model: str, messages: list[dict], sampling: RemoteSampling, info: ServerInfo | None
) -> dict:
    """The POST /v1/chat/completions body: OpenAI's fields always, llama-server's extras only
    for a server that speaks them (another server may reject unknown fields)."""
    s = sampling
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": s.temperature,
        "top_p": s.top_p,
        "max_tokens": s.max_tokens,
    }
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    if info is not None and info.llama_like:
        extras = {"top_k": s.top_k, "min_p": s.min_p, "repeat_penalty": s.repeat_penalty}
        body.update({k: v for k, v in extras.items() if v is not None})
    return body


def stream_chat(
    endpoint: RemoteEndpoint,
    model: str,
    messages: list[dict],
    sampling: RemoteSampling,
    info: ServerInfo | None = None,
) -> ChatStream:
    """A streamed reply of `model` on `endpoint`; nothing is sent until it is iterated.

    Args:
        endpoint: the server.
        model: an id from list_models().
        messages: OpenAI chat messages.
        sampling: the sampling fields; the llama-server extras go only where info.llama_like.
        info: what probe() said of the server (None: plain OpenAI).

    Returns:
        A ChatStream yielding ChatDelta; its last delta carries the finish_reason.
    """
    return ChatStream(endpoint, chat_body(model, messages, sampling, info))


def parse_metrics(text: str) -> RemoteMetrics:
    """The llamacpp:* samples of a Prometheus text page (unknown names are ignored)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("llamacpp:"):
            continue
        name, _, rest = line[len("llamacpp:") :].partition(" ")
        try:
            values[name.split("{")[0]] = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
    return RemoteMetrics(
        **{k: v for k, v in values.items() if k in RemoteMetrics.__dataclass_fields__}
    )


# -- helpers ------------------------------------------------------------------------------------


def _headers(ep: RemoteEndpoint) -> dict[str, str]:
    return {"Authorization": f"Bearer {ep.api_key}"} if ep.api_key else {}


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


def _model_n_ctx(m: dict) -> int:
    """The context a listed model has: ggstation's meta.n_ctx, vLLM's max_model_len, else the
    training context llama-server reports (meta.n_ctx_train)."""
    meta = _dict(m.get("meta"))
    for v in (meta.get("n_ctx"), m.get("max_model_len"), meta.get("n_ctx_train")):
        if _int(v) > 0:
            return _int(v)
    return 0


def _slot(s: dict) -> RemoteSlot:
    nxt = s.get("next_token")
    first = nxt[0] if isinstance(nxt, list) and nxt and isinstance(nxt[0], dict) else {}
    return RemoteSlot(
        _int(s.get("id")),
        _int(s.get("n_ctx")),
        bool(s.get("is_processing")),
        _int(s.get("n_prompt_tokens")),
        _int(first.get("n_decoded")),
    )


def _message_of(body: str) -> str:
    """The error message in an OpenAI-shaped error body, else the body's start."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body.strip()[:200]
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    if isinstance(err, str):
        return err
    return body.strip()[:200]


def _transport_error(ep: RemoteEndpoint, e: httpx.HTTPError) -> RemoteError:
    if isinstance(e, httpx.TimeoutException):
        return RemoteError(
            f"{ep.url} did not answer in time ({type(e).__name__}). Is the server busy or "
            "behind a firewall?",
            RemoteError.TIMEOUT,
        )
    if isinstance(e, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return RemoteError(f"{ep.url} is not a usable URL: {e}", RemoteError.BAD_URL)
    return RemoteError(
        f"Cannot reach {ep.url}: {e or type(e).__name__}. Check the address and that the "
        "server is running.",
        RemoteError.UNREACHABLE,
    )


def _status_error(ep: RemoteEndpoint, path: str, status: int, body: str) -> RemoteError:
    msg = _message_of(body)
    if status in (401, 403):
        what = "refused the API key" if ep.api_key else "needs an API key"
        return RemoteError(f"{ep.url} {what} (HTTP {status}: {msg})", RemoteError.AUTH, status)
    if status == 404:
        return RemoteError(
            f"{ep.url}{path} was not found (HTTP 404: {msg})", RemoteError.NOT_FOUND, status
        )
    return RemoteError(
        f"{ep.url}{path} failed with HTTP {status}: {msg}", RemoteError.SERVER, status
    )


def _server_error(ep: RemoteEndpoint, path: str, body: str) -> RemoteError:
    return RemoteError(f"{ep.url}{path} reported an error: {_message_of(body)}", RemoteError.SERVER)


def _not_openai(ep: RemoteEndpoint, path: str, why: str) -> RemoteError:
    return RemoteError(
        f"{ep.url}{path} did not answer like an OpenAI-compatible server: {why}.",
        RemoteError.NOT_OPENAI,
    )


def _broken(ep: RemoteEndpoint) -> RemoteError:
    return RemoteError(
        f"The connection to {ep.url} ended in the middle of the reply.", RemoteError.BROKEN
    )
