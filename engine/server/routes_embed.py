"""Embedding routes: OpenAI's /v1/embeddings and llama-server's /embedding and /embeddings.

The input takes every shape llama-server's does: a string; token ids; a list mixing ids and
strings (one prompt); a list of those (several prompts); an object with `prompt_string`; an
OpenAI content object `{"content": [{"type": "text", "text": ...}, ...]}`. The body's
`content` instead of `input` asks for the native answer even on /v1/embeddings.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ..errors import APIError
from ..scheduler import EmbeddingRequest
from ..tasks import EmbeddingResult
from ..vision import MediaPrompt
from . import media
from . import requests as rq
from .bodies import parse_body
from .errors import api_error, invalid, not_supported
from .routing import body_schema, client_gone, collect, server_state, submit

router = APIRouter()

_MEDIA_TYPES = {
    "image_url": "image",
    "input_audio": "audio",
    "input_video": "video",
    "video_url": "video",
}


class EmbeddingBody(BaseModel):
    """POST /v1/embeddings, /embeddings, /embedding. `input` (or `content`) is checked by
    embedding_prompts(): its shapes are more than a type annotation can say."""

    model_config = ConfigDict(extra="allow")

    input: Any = None
    content: Any = None
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    embd_normalize: int | None = Field(None, ge=-1)


def embedding_prompts(tok, items: Any) -> list[list[int]]:
    """llama-server's embedding inputs -> one token list per prompt.

    Raises:
        APIError: 400 naming what is wrong with the input.
    """
    if isinstance(items, list) and not any(_is_id(x) for x in items):
        prompts = [_prompt_tokens(tok, x) for x in items]  # several prompts
    else:
        prompts = [_prompt_tokens(tok, items)]
    if not prompts:
        raise invalid('"input" must not be empty')
    if any(not p for p in prompts):
        raise invalid("Input content cannot be empty")
    return prompts


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _prompt_tokens(tok, p: Any) -> list[int]:
    """One prompt (llama-server's tokenize_input_subprompt, plus OAI content objects)."""
    if isinstance(p, str):
        return tok.encode(p, add_special=True, parse_special=True)
    if isinstance(p, list) and all(_is_id(x) or isinstance(x, str) for x in p):
        return _mixed_tokens(tok, p)
    if isinstance(p, dict) and "content" in p:
        return _content_tokens(tok, p["content"])
    if isinstance(p, dict) and "prompt_string" in p:
        if p.get("multimodal_data"):
            raise invalid(
                "Multimodal data provided, but model does not support multimodal requests."
            )
        inner = p["prompt_string"]
        if (
            isinstance(inner, str)
            or isinstance(inner, list)
            and all(_is_id(x) or isinstance(x, str) for x in inner)
        ):
            return (
                _mixed_tokens(tok, inner) if isinstance(inner, list) else _prompt_tokens(tok, inner)
            )
    raise invalid(
        '"input" elements must be a string, a list of tokens, a JSON object containing a prompt '
        'string or an OpenAI "content" array, or a list of mixed strings & tokens.'
    )


def _mixed_tokens(tok, parts: list) -> list[int]:
    """llama.cpp tokenize_mixed: specials (BOS) only before a leading string."""
    ids: list[int] = []
    for i, x in enumerate(parts):
        ids += [x] if _is_id(x) else tok.encode(x, add_special=(i == 0), parse_special=True)
    return ids


def _content_tokens(tok, content: Any) -> list[int]:
    """An OpenAI content array: its text parts, joined; this model takes no media."""
    if not isinstance(content, list):
        raise invalid('"content" must be an array')
    text = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _MEDIA_TYPES:
            raise invalid(
                f"{_MEDIA_TYPES[kind]} input is not supported: this model has no multimodal projector"
            )
        if kind != "text":
            raise invalid(
                f"unsupported content[{i}].type {kind!r}; this model takes 'text' parts only"
            )
        value = part.get("text", "")
        if not isinstance(value, str):
            raise invalid(f"content[{i}].text must be a string")
        text.append(value)
    return tok.encode("".join(text), add_special=True, parse_special=True)


def _has_media(items: Any) -> bool:
    """Whether any input is a prompt object with multimodal_data or a content array with a
    media part."""
    for x in items if isinstance(items, list) else [items]:
        if not isinstance(x, dict):
            continue
        if x.get("multimodal_data"):
            return True
        content = x.get("content")
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") in _MEDIA_TYPES for p in content
        ):
            return True
    return False


def _media_prompts(s, items: Any) -> list[MediaPrompt]:
    """Embedding inputs with images (llama-server embeds them too): each a prompt object with
    multimodal_data, an OpenAI content array with image parts, or plain text."""
    out = []
    for i, x in enumerate(items if isinstance(items, list) else [items]):
        images: list[bytes] = []
        if isinstance(x, dict) and x.get("multimodal_data"):
            text = x.get("prompt_string")
            if not isinstance(text, str):
                raise invalid("'prompt_string' must be a string when 'multimodal_data' is given")
            images = media.multimodal_data(s, x["multimodal_data"])
        elif isinstance(x, dict) and isinstance(x.get("content"), list):
            text = media.content_with_markers(s, x["content"], images, f"input[{i}]")
            if not isinstance(text, str):  # text parts only
                text = "".join(str(p.get("text") or "") for p in text)
        elif isinstance(x, str):
            text = x
        else:
            raise invalid(
                f"input[{i}]: with images, each input is a string, a prompt object with "
                "multimodal_data or an OpenAI content array"
            )
        out.append(media.tokenize(s, text, images))
    return out


def check_size(s, prompts: list[list[int]], pooling: str) -> None:
    """llama-server's limits: a prompt pooled over all its tokens (not 'last') is computed in
    one physical batch, so it may not exceed --ubatch-size; none may fill a slot's context."""
    n_ubatch = int(getattr(s.scheduler.ctx, "n_ubatch", s.scheduler.n_batch))
    for ids in prompts:
        if min(ids, default=0) >= 0:  # a projector's prompt holds image placeholders (< 0)
            rq.check_tokens(s, ids)
        if pooling != "last" and len(ids) > n_ubatch:
            raise invalid(
                f"input ({len(ids)} tokens) is too large to process. increase the physical batch "
                f"size (current batch size: {n_ubatch})"
            )


async def _embed(request: Request, oai: bool):
    s = server_state(request)
    if not s.options.embeddings:
        raise not_supported("This server does not support embeddings. Start it with `--embeddings`")
    pooling = s.pooling()
    if oai and pooling == "none":
        raise invalid(
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type"
        )
    body = await parse_body(request, EmbeddingBody)
    if body.input is not None:
        items = body.input
    elif body.content is not None:
        items, oai = (
            body.content,
            False,
        )  # llama-server: "content" is not OpenAI's, so the answer is not
    else:
        raise invalid('"input" or "content" must be provided')
    if s.projector is not None and _has_media(items):
        mps = await run_in_threadpool(_media_prompts, s, items)
        prompts, media = [mp.tokens for mp in mps], [mp.media for mp in mps]
    else:
        prompts = await run_in_threadpool(embedding_prompts, s.tokenizer, items)
        media = [()] * len(prompts)
    check_size(s, prompts, pooling)
    norm = s.options.embd_normalize if body.embd_normalize is None else body.embd_normalize
    if pooling == "none":
        norm = -1  # llama-server: per-token vectors are never normalised
    results = await _run(
        request,
        s,
        [
            EmbeddingRequest(ids, pooling=pooling, normalize=norm, media=m)
            for ids, m in zip(prompts, media, strict=True)
        ],
    )
    if not isinstance(results, list):
        return results  # the client went away
    if not oai:
        return [
            {"index": i, "embedding": np.atleast_2d(r.embedding).tolist()}
            for i, r in enumerate(results)
        ]
    data = []
    for i, r in enumerate(results):
        vec = r.embedding.astype("<f4")
        emb = (
            base64.b64encode(vec.tobytes()).decode()
            if body.encoding_format == "base64"
            else vec.tolist()
        )
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n_tokens = sum(r.n_prompt for r in results)
    return {
        "object": "list",
        "model": body.model or s.model_alias,
        "data": data,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }


async def _run(request: Request, s, reqs: list[EmbeddingRequest]):
    """Submit every prompt at once (they run in parallel slots); the results in order."""
    handles = [submit(s, r) for r in reqs]
    results: list[EmbeddingResult] = []
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
    return results


@router.post("/v1/embeddings", openapi_extra=body_schema(EmbeddingBody))
async def embeddings_oai(request: Request):
    return await _embed(request, oai=True)


@router.post("/embedding", openapi_extra=body_schema(EmbeddingBody))
@router.post("/embeddings", openapi_extra=body_schema(EmbeddingBody), include_in_schema=False)
async def embedding_native(request: Request):
    return await _embed(request, oai=False)
