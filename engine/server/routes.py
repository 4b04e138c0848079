"""Generation, tokenizer and template routes: /v1/chat/completions, /v1/completions,
/completion, /tokenize, /detokenize, /apply-template.

Handlers parse the body themselves (`parse_body`), so malformed JSON, invalid UTF-8,
oversized bodies and wrong types all become 400s in the error shape of errors.py, and curl's
default form content type is accepted as llama-server accepts it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from ..tasks import PromptProgress, RequestHandle
from . import requests as rq
from .bodies import parse_body
from .errors import api_error
from .openai import DONE, ChatFormatter, Formatter, NativeFormatter, TextFormatter, merge, sse
from .routing import (
    SSE_HEADERS,
    EventStream,
    body_schema,
    client_gone,
    collect,
    server_state,
    submit,
)
from .schemas import (
    ApplyTemplateRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    OpenAICommon,
    TokenizeRequest,
)

log = logging.getLogger(__name__)
router = APIRouter()


# -- tokenizer and template ----------------------------------------------------------------


@router.post("/tokenize", openapi_extra=body_schema(TokenizeRequest))
async def tokenize(request: Request):
    s = server_state(request)
    body = await parse_body(request, TokenizeRequest)
    ids = await run_in_threadpool(
        s.tokenizer.encode, body.content, body.add_special, body.parse_special
    )
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
@router.post(
    "/chat/completions", openapi_extra=body_schema(ChatCompletionRequest), include_in_schema=False
)
async def chat_completions(request: Request):
    s = server_state(request)
    body = await parse_body(request, ChatCompletionRequest)
    req, prompt_text = await run_in_threadpool(rq.chat_request, s, body)
    reqs = rq.with_choices([req], rq.n_choices(s, body))
    fmts = _formatters(
        ChatFormatter,
        s,
        body,
        reqs,
        [prompt_text] * len(reqs),
        "chatcmpl-",
        logprobs=bool(body.logprobs),
        reading=rq.reply_reading(s, body, prompt_text),
    )
    return await _generate(request, reqs, fmts, body, native=False)


@router.post("/v1/chat/completions/input_tokens", openapi_extra=body_schema(ChatCompletionRequest))
@router.post(
    "/chat/completions/input_tokens",
    openapi_extra=body_schema(ChatCompletionRequest),
    include_in_schema=False,
)
async def chat_input_tokens(request: Request):
    """How many prompt tokens the chat renders to, without generating (llama-server)."""
    s = server_state(request)
    body = await parse_body(request, ChatCompletionRequest)
    req, _ = await run_in_threadpool(rq.chat_request, s, body)
    return {"input_tokens": len(req.prompt), "object": "response.input_tokens"}


@router.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
async def completions(request: Request):
    return await _completion(request, native=False)


@router.post("/completion", openapi_extra=body_schema(CompletionRequest))
@router.post("/completions", openapi_extra=body_schema(CompletionRequest), include_in_schema=False)
async def completion(request: Request):
    return await _completion(request, native=True)


async def _completion(request: Request, native: bool):
    s = server_state(request)
    body = await parse_body(request, CompletionRequest)
    reqs = await run_in_threadpool(rq.completion_requests, s, body)
    n = rq.n_choices(s, body)
    texts = [t for r in reqs for t in [rq.prompt_text(s, body.prompt, r.prompt)] * n]
    reqs = rq.with_choices(reqs, n)
    if native:
        fmts = _formatters(
            NativeFormatter,
            s,
            body,
            reqs,
            texts,
            "cmpl-",
            return_tokens=bool(body.return_tokens),
            response_fields=body.response_fields,
        )
    else:
        fmts = _formatters(TextFormatter, s, body, reqs, texts, "cmpl-")
    return await _generate(request, reqs, fmts, body, native=native)


def _formatters(
    cls: type[Formatter], s, body: OpenAICommon, reqs: list, texts: list[str], prefix: str, **kw
) -> list[Formatter]:
    """One formatter per result, sharing the request's id."""
    ident, created = prefix + uuid.uuid4().hex[:24], int(time.time())
    stream = body.stream
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    verbose = rq.verbose(s, body)
    return [
        cls(
            s,
            body.model or s.model_alias,
            s.tokenizer,
            n_probs=r.params.n_probs,
            include_usage=include_usage,
            index=i,
            id=ident,
            created=created,
            generation_settings=rq.generation_settings(s, r, stream, body),
            prompt_text=text,
            verbose=verbose,
            post_sampling=bool(body.post_sampling_probs),
            timings_per_token=bool(body.timings_per_token),
            **kw,
        )
        for i, (r, text) in enumerate(zip(reqs, texts, strict=True))
    ]


async def _generate(
    request: Request, reqs: list, fmts: list[Formatter], body: OpenAICommon, native: bool
):
    """Run the results' requests; one reply, or one event stream interleaving them."""
    s = server_state(request)
    stream = body.stream
    for r in reqs:
        r.return_progress = bool(stream and body.return_progress)
    handles: list[RequestHandle | None] = []
    try:
        for r, f in zip(reqs, fmts, strict=True):
            if r.n_predict == 0:  # nothing to generate (llama.cpp: evaluate nothing, return empty)
                f.acc.last = f.empty_step(len(r.prompt))
                handles.append(None)
                continue
            h = submit(s, r)
            f.id_slot = h.slot_id
            handles.append(h)
    except BaseException:
        _cancel(handles)
        raise
    if stream:
        return EventStream(
            _stream(handles, fmts), on_close=lambda: _cancel(handles), headers=SSE_HEADERS
        )
    try:
        done = await asyncio.gather(
            *(_collect(request, h, f) for h, f in zip(handles, fmts, strict=True))
        )
    except asyncio.CancelledError:
        _cancel(handles)
        raise
    except Exception as e:
        _cancel(handles)
        raise api_error(e) from None
    if not all(done):
        _cancel(handles)
        return client_gone()
    return JSONResponse(merge([f.response() for f in fmts], native))


async def _collect(request: Request, handle, fmt: Formatter) -> bool:
    if handle is None:
        return True

    def on_item(item) -> None:
        if not isinstance(item, PromptProgress):
            fmt.add(item)

    if not await collect(request, handle, on_item):
        return False
    fmt.id_slot = handle.slot_id
    if fmt.acc.last is None:  # ended without a token (server shutting down)
        fmt.acc.last = fmt.empty_step(len(handle.request.prompt))
    return True


def _cancel(handles: list) -> None:
    for h in handles:
        if h is not None and not h.done:
            h.cancel()


_END = object()


async def _items(handles: list) -> AsyncIterator[list[tuple[int, object]]]:
    """(result index, item) from every handle as they come, in lists of those that came
    together; (i, _END) when result i ends."""
    if len(handles) == 1:
        if handles[0] is not None:
            async for batch in handles[0].abatches():
                yield [(0, item) for item in batch]
        yield [(0, _END)]
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, h) -> None:
        try:
            if h is not None:
                async for item in h.astream():
                    await queue.put((i, item))
        except Exception as e:  # handed to the consumer
            await queue.put((i, e))
        await queue.put((i, _END))

    tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    remaining = len(handles)
    try:
        while remaining:
            i, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            remaining -= item is _END
            yield [(i, item)]
    finally:
        for t in tasks:
            t.cancel()


async def _stream(handles: list, fmts: list[Formatter]):
    try:
        async for batch in _items(handles):
            out = []  # one write for the tokens that came together
            for i, item in batch:
                fmt, handle = fmts[i], handles[i]
                if handle is not None:
                    fmt.id_slot = handle.slot_id
                if item is _END:
                    if fmt.acc.last is None:
                        fmt.acc.last = fmt.empty_step(
                            len(handle.request.prompt) if handle is not None else 0
                        )
                    chunks = fmt.final_chunks()
                elif isinstance(item, PromptProgress):
                    chunks = fmt.progress_chunks(item)
                else:
                    fmt.add(item)
                    chunks = fmt.chunk(item)
                out += [sse(obj) for obj in chunks]
            if out:
                yield b"".join(out)
        if fmts[0].send_done:
            yield DONE
    except Exception as e:  # headers are sent: the error goes in the stream
        yield sse(api_error(e).body())
    finally:
        _cancel(handles)


__all__ = ["router"]
