"""A minimal OpenAI-compatible server for tests of the remote client (engine/remote.py) and the
app's remote endpoints: GET /v1/models and POST /v1/chat/completions (stream or not), and
nothing of llama-server's (/props, /slots and /metrics answer 404), as vLLM or a hosted API.

    server = openai_server.start(api_key="k", models=("alpha", "beta"))
    ... server.url, server.requests (the JSON bodies received), server.cancelled (set when a
    client left a stream before its end) ...
    server.stop()

Faults: `server.drop_after = n` ends the next stream after n chunks without finishing the HTTP
response (a dead connection mid-stream); `server.endless = True` streams until the client
leaves; `server.not_json = True` answers every route with an HTML page; `server.props = {...}`
makes GET /props answer (a llama-server look-alike). A wrong or missing
key gets OpenAI's 401 body.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

REPLY = "Hello from the remote server. This reply streams word by word."


@dataclass
class OpenAIServer:
    api_key: str = ""
    models: tuple[str, ...] = ("remote-model",)
    chunk_delay_s: float = 0.01
    drop_after: int = 0
    endless: bool = False
    not_json: bool = False
    props: dict | None = None  # GET /props answers this (else 404, as a plain OpenAI server)
    requests: list[dict] = field(default_factory=list)
    cancelled: threading.Event = field(default_factory=threading.Event)
    url: str = ""
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)


def _unauthorized() -> JSONResponse:
    return JSONResponse(
        {
            "error": {
                "message": "Incorrect API key provided.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
        },
        status_code=401,
    )


def _chunk(model: str, content: str | None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content is not None else {}
    obj = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(obj)}\n\n".encode()


def create_app(state: OpenAIServer) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if state.not_json:
            return HTMLResponse("<html><body>It works!</body></html>")
        if state.api_key and request.headers.get("authorization") != f"Bearer {state.api_key}":
            return _unauthorized()
        return await call_next(request)

    @app.get("/props")
    async def props():
        if state.props is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return state.props

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": m, "object": "model", "owned_by": "tests"} for m in state.models],
        }

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        state.requests.append(body)
        if body.get("model") not in state.models:
            return JSONResponse(
                {
                    "error": {
                        "message": f"The model `{body.get('model')}` does not exist",
                        "type": "invalid_request_error",
                        "code": "model_not_found",
                    }
                },
                status_code=404,
            )
        words = [w + " " for w in REPLY.split(" ")]
        words[-1] = words[-1].rstrip()
        if not body.get("stream"):
            return JSONResponse(
                {
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "".join(words)},
                            "finish_reason": "stop",
                        }
                    ],
                }
            )
        return _ClosingStream(_stream(state, body, words), media_type="text/event-stream")

    return app


class _ClosingStream(StreamingResponse):
    """Closes its generator when the response ends, however it ends: a client that left makes
    the send fail, and the abandoned generator would otherwise see GeneratorExit (and set
    `cancelled`) only when the garbage collector gets to it, never with the collector off."""

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[union-attr]


async def _stream(state: OpenAIServer, body: dict, words: list[str]):
    model = body["model"]
    n = 0
    try:
        while True:
            for w in words:
                if state.drop_after and n >= state.drop_after:
                    raise ConnectionAbortedError("test server drops the connection")
                yield _chunk(model, w)
                n += 1
                await asyncio.sleep(state.chunk_delay_s)
            if not state.endless:
                break
        yield _chunk(model, None, "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
            yield f"data: {json.dumps({'object': 'chat.completion.chunk', 'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"
    except (asyncio.CancelledError, GeneratorExit):
        state.cancelled.set()  # the client left before the end
        raise


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(api_key: str = "", models: tuple[str, ...] = ("remote-model",), **faults) -> OpenAIServer:
    state = OpenAIServer(api_key=api_key, models=models, **faults)
    port = _free_port()
    config = uvicorn.Config(
        create_app(state), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    state._server = server = uvicorn.Server(config)
    state._thread = threading.Thread(target=server.run, daemon=True)
    state._thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.started:
        raise RuntimeError("the test OpenAI server did not start")
    state.url = f"http://127.0.0.1:{port}"
    return state
