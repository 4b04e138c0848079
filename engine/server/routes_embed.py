"""Embedding routes: OpenAI's /v1/embeddings and llama-server's /embedding."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from ..errors import APIError
from ..scheduler import EmbeddingRequest
from ..tasks import EmbeddingResult
from . import requests as rq
from .bodies import parse_body
from .errors import api_error, invalid, not_supported
from .routing import body_schema, client_gone, collect, server_state, submit
from .schemas import EmbeddingsRequest

router = APIRouter()


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
    s = server_state(request)
    if not s.options.embeddings:
        raise not_supported("This server does not support embeddings. Start it with `--embeddings`")
    body = await parse_body(request, EmbeddingsRequest)
    pooling = s.pooling()
    if oai and pooling == "none":
        raise invalid("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    inputs = await run_in_threadpool(_embedding_inputs, s, body.items)
    norm = s.options.embd_normalize if body.embd_normalize is None else body.embd_normalize
    handles = [submit(s, EmbeddingRequest(ids, pooling=pooling, normalize=norm)) for ids in inputs]
    results = []
    try:
        for h in handles:
            got: list[EmbeddingResult] = []
            if not await collect(request, h, got.append):
                return client_gone()
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


@router.post("/v1/embeddings", openapi_extra=body_schema(EmbeddingsRequest))
@router.post("/embeddings", openapi_extra=body_schema(EmbeddingsRequest), include_in_schema=False)
async def embeddings_oai(request: Request):
    return await _embed(request, oai=True)


@router.post("/embedding", openapi_extra=body_schema(EmbeddingsRequest))
async def embedding_native(request: Request):
    return await _embed(request, oai=False)

