"""Route handlers: llama-server's endpoints and OpenAI's, on one APIRouter.

Handlers parse the body themselves (`parse_body`), so malformed JSON, invalid UTF-8,
oversized bodies and wrong types all become 400s in the error shape of errors.py, and curl's
default form content type is accepted as llama-server accepts it.
"""

from __future__ import annotations

import asyncio
import base64
import logging

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ..errors import APIError
from ..scheduler import EmbeddingRequest
from ..seams import ServerTokenizer
from ..tasks import EmbeddingResult
from . import requests as rq
from .bodies import parse_body
from .errors import api_error, invalid, not_supported
from .openai import DONE, ChatFormatter, NativeFormatter, TextFormatter, sse
from .schemas import (
    ApplyTemplateRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingsRequest,
    TokenizeRequest,
)

log = logging.getLogger(__name__)
router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# Bodies are parsed by hand (parse_body), so FastAPI does not know them: each route names its
# model in openapi_extra, and with_body_schemas() puts the models under components/schemas.
# A model's own schema cannot be inlined there: its $refs ("#/$defs/ChatMessage") would
# point into the OpenAPI document's root, where there is no $defs.
_BODY_MODELS: dict[str, type[BaseModel]] = {}


def _schema(model: type[BaseModel]) -> dict:
    _BODY_MODELS[model.__name__] = model
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def with_body_schemas(spec: dict) -> dict:
    """`spec` with the request-body models, and the models they use, in components/schemas."""
    _, defs = models_json_schema([(m, "validation") for m in _BODY_MODELS.values()],
                                 ref_template="#/components/schemas/{model}")
    spec.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
    return spec


def _state(request: Request):
    return request.app.state.server


# -- monitoring --------------------------------------------------------------------------


@router.get("/health")
@router.get("/v1/health")
async def health(request: Request):
    return {"status": "ok"}


@router.get("/v1/models")
@router.get("/models")
async def models(request: Request):
    s = _state(request)
    meta = s.model_meta()
    return {
        "object": "list",
        "data": [{"id": s.model_alias, "object": "model", "created": s.created,
                  "owned_by": "ggstation", "meta": meta}],
        "models": [{"name": s.model_alias, "model": s.model_alias, "modified_at": "", "size": "",
                    "digest": "", "type": "model", "description": "", "tags": [""],
                    "capabilities": ["completion"] + (["embeddings"] if s.options.embeddings else []),
                    "parameters": "", "details": {"format": "gguf"}}],
    }


@router.get("/props")
async def props(request: Request):
    s = _state(request)
    tok = s.tokenizer
    template = s.chat_template
    return {
        "default_generation_settings": {
            "id": 0, "id_task": -1, "n_ctx": s.n_ctx_seq, "speculative": False,
            "is_processing": False, "params": rq.generation_settings(s),
        },
        "total_slots": s.n_slots,
        "model_alias": s.model_alias,
        "model_path": s.model_path,
        "modalities": {"vision": False, "audio": False},
        "chat_template": template.source if template is not None else "",
        "bos_token": _token_text(tok, tok.bos_id),
        "eos_token": _token_text(tok, tok.eos_id),
        "build_info": "ggstation",
        "embeddings": s.options.embeddings,
    }


@router.post("/props")
async def set_props(request: Request):
    if not _state(request).options.props_writable:
        raise not_supported("This server does not support changing global properties. Start it with `--props`")
    await parse_body(request, _AnyBody)
    return {"success": True}


class _AnyBody(BaseModel):
    model_config = {"extra": "allow"}


@router.get("/slots")
async def slots(request: Request, fail_on_no_slot: int = 0):
    s = _state(request)
    if not s.options.slots:
        raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
    info = s.scheduler.slots_info()
    if fail_on_no_slot and all(x["is_processing"] for x in info):
        raise APIError(503, "no slot available", "unavailable_error")
    for x in info:
        x["speculative"] = False
        x["params"] = rq.generation_settings(s)
    return info


@router.post("/slots/{slot_id}")
async def slot_action(request: Request, slot_id: int, action: str = ""):
    raise not_supported(f"slot action '{action}' is not supported by this server")


@router.get("/metrics")
async def metrics(request: Request):
    s = _state(request)
    if not s.options.metrics:
        raise not_supported("This server does not support metrics endpoint. Start it with `--metrics`")
    return PlainTextResponse(_prometheus(s), media_type="text/plain; version=0.0.4")


def _prometheus(s) -> str:
    m = s.scheduler.metrics
    rows = [
        ("counter", "prompt_tokens_total", "Number of prompt tokens processed.", m.n_prompt_tokens_total),
        ("counter", "prompt_seconds_total", "Prompt process time", m.t_prompt_s_total),
        ("counter", "tokens_predicted_total", "Number of generation tokens processed.", m.n_tokens_predicted_total),
        ("counter", "tokens_predicted_seconds_total", "Predict process time", m.t_predicted_s_total),
        ("counter", "n_decode_total", "Total number of llama_decode() calls", m.n_decode_total),
        ("gauge", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
         m.n_busy_slots_total / m.n_decode_total if m.n_decode_total else 0.0),
        ("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
         m.n_prompt_tokens_total / m.t_prompt_s_total if m.t_prompt_s_total else 0.0),
        ("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s.",
         m.n_tokens_predicted_total / m.t_predicted_s_total if m.t_predicted_s_total else 0.0),
        ("gauge", "requests_processing", "Number of requests processing.", s.scheduler.n_busy()),
        ("gauge", "requests_deferred", "Number of requests deferred.", s.scheduler.n_pending()),
    ]
    lines = []
    for kind, name, help_, value in rows:
        lines += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
    return "\n".join(lines) + "\n"


def _token_text(tok: ServerTokenizer, token: int | None) -> str:
    if token is None or not 0 <= token < tok.n_vocab:
        return ""
    return tok.token_to_piece(token).decode("utf-8", "replace")


# -- tokenizer and template ----------------------------------------------------------------


@router.post("/tokenize", openapi_extra=_schema(TokenizeRequest))
async def tokenize(request: Request):
    s = _state(request)
    body = await parse_body(request, TokenizeRequest)
    ids = await run_in_threadpool(s.tokenizer.encode, body.content, body.add_special, body.parse_special)
    if not body.with_pieces:
        return {"tokens": ids}
    out = []
    for t in ids:
        raw = s.tokenizer.token_to_piece(t)
        try:
            piece = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        out.append({"id": t, "piece": piece})
    return {"tokens": out}


@router.post("/detokenize", openapi_extra=_schema(DetokenizeRequest))
async def detokenize(request: Request):
    s = _state(request)
    body = await parse_body(request, DetokenizeRequest)
    rq.check_tokens(s, body.tokens)
    return {"content": await run_in_threadpool(s.tokenizer.decode, body.tokens)}


@router.post("/apply-template", openapi_extra=_schema(ApplyTemplateRequest))
async def apply_template(request: Request):
    s = _state(request)
    body = await parse_body(request, ApplyTemplateRequest)
    return {"prompt": await run_in_threadpool(rq.render_chat, s, body)}


# -- generation ------------------------------------------------------------------------------


@router.post("/v1/chat/completions", openapi_extra=_schema(ChatCompletionRequest))
@router.post("/chat/completions", openapi_extra=_schema(ChatCompletionRequest), include_in_schema=False)
async def chat_completions(request: Request):
    s = _state(request)
    body = await parse_body(request, ChatCompletionRequest)
    req, _ = await run_in_threadpool(rq.chat_request, s, body)
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    fmt = ChatFormatter(s, body.model or s.model_alias, s.tokenizer, n_probs=req.params.n_probs,
                        include_usage=include_usage, logprobs=bool(body.logprobs))
    return await _generate(request, req, fmt, body.stream)


@router.post("/v1/completions", openapi_extra=_schema(CompletionRequest))
async def completions(request: Request):
    s = _state(request)
    body = await parse_body(request, CompletionRequest)
    req = await run_in_threadpool(rq.completion_request, s, body, False)
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    fmt = TextFormatter(s, body.model or s.model_alias, s.tokenizer, n_probs=req.params.n_probs,
                        include_usage=include_usage)
    return await _generate(request, req, fmt, body.stream)


@router.post("/completion", openapi_extra=_schema(CompletionRequest))
@router.post("/completions", openapi_extra=_schema(CompletionRequest), include_in_schema=False)
async def completion(request: Request):
    s = _state(request)
    body = await parse_body(request, CompletionRequest)
    req = await run_in_threadpool(rq.completion_request, s, body, True)
    prompt_text = body.prompt if isinstance(body.prompt, str) else ""
    fmt = NativeFormatter(s, body.model or s.model_alias, s.tokenizer, n_probs=req.params.n_probs,
                          return_tokens=bool(body.return_tokens),
                          generation_settings=rq.generation_settings(s, req, body.stream),
                          prompt_text=prompt_text)
    return await _generate(request, req, fmt, body.stream)


def _submit(s, req):
    try:
        return s.scheduler.submit(req)
    except Exception as e:
        raise api_error(e) from None


async def _generate(request: Request, req, fmt, stream: bool):
    s = _state(request)
    if req.n_predict == 0:  # nothing to generate (llama.cpp: evaluate nothing, return empty)
        fmt.acc.last = fmt.empty_step(len(req.prompt))
        return _stream_static(fmt) if stream else fmt.response()
    handle = _submit(s, req)
    fmt.id_slot = handle.slot_id
    if stream:
        return EventStream(_stream(handle, fmt), on_close=handle.cancel, headers=SSE_HEADERS)
    try:
        if not await _collect(request, handle, fmt.add):
            return _client_gone()
        if fmt.acc.last is None:  # ended without a token (server shutting down)
            fmt.acc.last = fmt.empty_step(len(req.prompt))
    except asyncio.CancelledError:
        handle.cancel()
        raise
    except Exception as e:
        raise api_error(e) from None
    return JSONResponse(fmt.response())


def _client_gone() -> Response:
    """The answer to a client that went away: nobody reads it, but returning one (rather than
    raising) keeps uvicorn from logging a disconnect as an error, and the request log shows
    nginx's "client closed request" code."""
    return Response(status_code=499)


async def _collect(request: Request, handle, on_item) -> bool:
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


async def _stream(handle, fmt):
    try:
        async for step in handle.astream():
            fmt.id_slot = handle.slot_id
            fmt.add(step)
            for obj in fmt.chunk(step):
                yield sse(obj)
        if fmt.acc.last is None:
            fmt.acc.last = fmt.empty_step(len(handle.request.prompt))
        for obj in fmt.final_chunks():
            yield sse(obj)
        if fmt.send_done:
            yield DONE
    except Exception as e:  # headers are sent: the error goes in the stream
        yield sse(api_error(e).body())
    finally:
        if not handle.done:
            handle.cancel()


def _stream_static(fmt):
    async def gen():
        for obj in fmt.final_chunks():
            yield sse(obj)
        if fmt.send_done:
            yield DONE

    return EventStream(gen(), on_close=lambda: None, headers=SSE_HEADERS)


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


# -- embeddings --------------------------------------------------------------------------------


def _embedding_inputs(s, items) -> list[list[int]]:
    tok = s.tokenizer
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list) or not items:
        raise invalid("'input' must be a non-empty string, list of strings or list of token lists")
    if all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        items = [items]
    out = []
    for i, x in enumerate(items):
        ids = tok.encode(x, add_special=True, parse_special=True) if isinstance(x, str) else list(x)
        if not ids:
            raise invalid(f"input[{i}] is empty")
        out.append(rq.check_tokens(s, ids))
    return out


async def _embed(request: Request, oai: bool):
    s = _state(request)
    if not s.options.embeddings:
        raise not_supported("This server does not support embeddings. Start it with `--embeddings`")
    body = await parse_body(request, EmbeddingsRequest)
    pooling = s.pooling()
    if oai and pooling == "none":
        raise invalid("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    inputs = await run_in_threadpool(_embedding_inputs, s, body.items)
    norm = s.options.embd_normalize if body.embd_normalize is None else body.embd_normalize
    handles = [_submit(s, EmbeddingRequest(ids, pooling=pooling, normalize=norm)) for ids in inputs]
    results = []
    try:
        for h in handles:
            got: list[EmbeddingResult] = []
            if not await _collect(request, h, got.append):
                return _client_gone()
            if not got:
                raise APIError(503, "server is shutting down")
            results.append(got[0])
    except Exception as e:
        raise api_error(e) from None
    finally:
        for h in handles:
            if not h.done:
                h.cancel()
    n_tokens = sum(r.n_prompt for r in results)
    if not oai:
        return [{"index": i, "embedding": np.atleast_2d(r.embedding).tolist()} for i, r in enumerate(results)]
    data = []
    for i, r in enumerate(results):
        vec = r.embedding.astype("<f4")
        emb = base64.b64encode(vec.tobytes()).decode() if body.encoding_format == "base64" else vec.tolist()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return {"object": "list", "model": body.model or s.model_alias, "data": data,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


@router.post("/v1/embeddings", openapi_extra=_schema(EmbeddingsRequest))
@router.post("/embeddings", openapi_extra=_schema(EmbeddingsRequest), include_in_schema=False)
async def embeddings_oai(request: Request):
    return await _embed(request, oai=True)


@router.post("/embedding", openapi_extra=_schema(EmbeddingsRequest))
async def embedding_native(request: Request):
    return await _embed(request, oai=False)


@router.get("/")
async def root(request: Request):
    s = _state(request)
    return {"name": "ggstation", "model": s.model_alias, "endpoints": ["/v1/chat/completions", "/v1/completions",
            "/completion", "/v1/embeddings", "/tokenize", "/detokenize", "/apply-template", "/props",
            "/slots", "/metrics", "/health", "/v1/models"]}
