"""Monitoring and model-information routes: /health, /models, /props, /slots, /metrics, /."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import PlainTextResponse

from ..errors import APIError
from ..seams import ServerTokenizer
from . import requests as rq
from .bodies import parse_body
from .errors import not_supported
from .routing import server_state

router = APIRouter()


# -- monitoring --------------------------------------------------------------------------


@router.get("/health")
@router.get("/v1/health")
async def health(request: Request):
    return {"status": "ok"}


@router.get("/v1/models")
@router.get("/models")
async def models(request: Request):
    s = server_state(request)
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
    s = server_state(request)
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
        "is_sleeping": s.is_sleeping,
    }


@router.post("/props")
async def set_props(request: Request):
    if not server_state(request).options.props_writable:
        raise not_supported("This server does not support changing global properties. Start it with `--props`")
    await parse_body(request, _AnyBody)
    return {"success": True}


class _AnyBody(BaseModel):
    model_config = {"extra": "allow"}


@router.get("/slots")
async def slots(request: Request, fail_on_no_slot: int = 0):
    s = server_state(request)
    if not s.options.slots:
        raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
    info = s.scheduler.slots_info()
    if fail_on_no_slot and all(x["is_processing"] for x in info):
        raise APIError(503, "no slot available", "unavailable_error")
    for x in info:
        x["speculative"] = False
        x["params"] = rq.generation_settings(s)
    return info


@router.get("/metrics")
async def metrics(request: Request):
    s = server_state(request)
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



@router.get("/")
async def root(request: Request):
    s = server_state(request)
    return {"name": "ggstation", "model": s.model_alias, "endpoints": ["/v1/chat/completions", "/v1/completions",
            "/completion", "/v1/embeddings", "/tokenize", "/detokenize", "/apply-template", "/props",
            "/slots", "/metrics", "/health", "/v1/models"]}
