"""Generation, tokenizer and template routes: /v1/chat/completions, /v1/completions,
/completion, /tokenize, /detokenize, /apply-template.

Handlers parse the body themselves (`parse_body`), so malformed JSON, invalid UTF-8,
oversized bodies and wrong types all become 400s in the error shape of errors.py, and curl's
default form content type is accepted as llama-server accepts it.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from . import requests as rq
from .bodies import parse_body
from .errors import api_error
from .openai import DONE, ChatFormatter, NativeFormatter, TextFormatter, sse
from .routing import SSE_HEADERS, EventStream, body_schema, client_gone, collect, server_state, submit
from .schemas import (
    ApplyTemplateRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)

log = logging.getLogger(__name__)
router = APIRouter()


# -- tokenizer and template ----------------------------------------------------------------


@router.post("/tokenize", openapi_extra=body_schema(TokenizeRequest))
async def tokenize(request: Request):
    s = server_state(request)
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


@router.post("/detokenize", openapi_extra=body_schema(DetokenizeRequest))
async def detokenize(request: Request):
    s = server_state(request)
    body = await parse_body(request, DetokenizeRequest)
    rq.check_tokens(s, body.tokens)
    return {"content": await run_in_threadpool(s.tokenizer.decode, body.tokens)}


@router.post("/apply-template", openapi_extra=body_schema(ApplyTemplateRequest))
async def apply_template(request: Request):
    s = server_state(request)
    body = await parse_body(request, ApplyTemplateRequest)
    return {"prompt": await run_in_threadpool(rq.render_chat, s, body)}



# -- generation ------------------------------------------------------------------------------


@router.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
@router.post("/chat/completions", openapi_extra=body_schema(ChatCompletionRequest), include_in_schema=False)
async def chat_completions(request: Request):
    s = server_state(request)
    body = await parse_body(request, ChatCompletionRequest)
    req, _ = await run_in_threadpool(rq.chat_request, s, body)
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    fmt = ChatFormatter(s, body.model or s.model_alias, s.tokenizer, n_probs=req.params.n_probs,
                        include_usage=include_usage, logprobs=bool(body.logprobs))
    return await _generate(request, req, fmt, body.stream)


@router.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
async def completions(request: Request):
    s = server_state(request)
    body = await parse_body(request, CompletionRequest)
    req = await run_in_threadpool(rq.completion_request, s, body, False)
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    fmt = TextFormatter(s, body.model or s.model_alias, s.tokenizer, n_probs=req.params.n_probs,
                        include_usage=include_usage)
    return await _generate(request, req, fmt, body.stream)


@router.post("/completion", openapi_extra=body_schema(CompletionRequest))
@router.post("/completions", openapi_extra=body_schema(CompletionRequest), include_in_schema=False)
async def completion(request: Request):
    s = server_state(request)
    body = await parse_body(request, CompletionRequest)
    req = await run_in_threadpool(rq.completion_request, s, body, True)
    prompt_text = body.prompt if isinstance(body.prompt, str) else ""
    fmt = NativeFormatter(s, body.model or s.model_alias, s.tokenizer, n_probs=req.params.n_probs,
                          return_tokens=bool(body.return_tokens),
                          generation_settings=rq.generation_settings(s, req, body.stream),
                          prompt_text=prompt_text)
    return await _generate(request, req, fmt, body.stream)



async def _generate(request: Request, req, fmt, stream: bool):
    s = server_state(request)
    if req.n_predict == 0:  # nothing to generate (llama.cpp: evaluate nothing, return empty)
        fmt.acc.last = fmt.empty_step(len(req.prompt))
        return _stream_static(fmt) if stream else fmt.response()
    handle = submit(s, req)
    fmt.id_slot = handle.slot_id
    if stream:
        return EventStream(_stream(handle, fmt), on_close=handle.cancel, headers=SSE_HEADERS)
    try:
        if not await collect(request, handle, fmt.add):
            return client_gone()
        if fmt.acc.last is None:  # ended without a token (server shutting down)
            fmt.acc.last = fmt.empty_step(len(req.prompt))
    except asyncio.CancelledError:
        handle.cancel()
        raise
    except Exception as e:
        raise api_error(e) from None
    return JSONResponse(fmt.response())




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


