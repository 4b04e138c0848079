"""Monitoring and model-information routes: /health, /models, /props, /slots, /metrics, /."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import JSONResponse, PlainTextResponse, Response

from ..errors import APIError
from ..seams import ServerTokenizer
from ..tasks import GenerationRequest
from ..version import __version__
from . import requests as rq
from .bodies import parse_body
from .errors import not_supported
from .media import MEDIA_MARKER
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
    meta = {**s.model_meta(), "n_ctx": s.n_ctx_seq}
    return {
        "object": "list",
        "data": [
            {
                "id": s.model_alias,
                "aliases": s.model_aliases or [s.model_alias],
                "tags": list(s.options.model_tags),
                "object": "model",
                "created": s.created,
                "owned_by": "ggstation",
                "meta": meta,
            }
        ],
        "models": [
            {
                "name": s.model_alias,
                "model": s.model_alias,
                "modified_at": "",
                "size": "",
                "digest": "",
                "type": "model",
                "description": "",
                "tags": [""],
                "capabilities": ["completion"]
                + (["multimodal"] if s.projector is not None else [])
                + (["embeddings"] if s.options.embeddings else []),
                "parameters": "",
                "details": {"format": "gguf"},
            }
        ],
    }


@router.get("/props")
async def props(request: Request):
    s = server_state(request)
    tok = s.tokenizer
    template = s.chat_template
    opts = s.options
    return {
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": s.n_ctx_seq,
            "speculative": False,
            "is_processing": False,
            "params": rq.generation_settings(s),
        },
        "total_slots": s.n_slots,
        "model_alias": s.model_alias,
        "model_path": s.model_path,
        "modalities": {"vision": s.projector is not None, "video": False, "audio": False},
        "media_marker": MEDIA_MARKER,
        "endpoint_slots": opts.slots,
        "endpoint_props": opts.props_writable,
        "endpoint_metrics": opts.metrics,
        "chat_template": template.source if template is not None else "",
        "bos_token": _token_text(tok, tok.bos_id),
        "eos_token": _token_text(tok, tok.eos_id),
        "build_info": "ggstation",
        "embeddings": opts.embeddings,
        "cors_proxy_enabled": opts.cors_proxy,
        "is_sleeping": s.is_sleeping,
    }


@router.post("/props")
async def set_props(request: Request):
    if not server_state(request).options.props_writable:
        raise not_supported(
            "This server does not support changing global properties. Start it with `--props`"
        )
    await parse_body(request, _AnyBody)
    return {"success": True}


class _AnyBody(BaseModel):
    model_config = {"extra": "allow"}


@router.get("/slots")
async def slots(request: Request, fail_on_no_slot: str = ""):
    s = server_state(request)
    if not s.options.slots:
        raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
    info = s.scheduler.slots_info()
    if fail_on_no_slot and all(x["is_processing"] for x in info):
        raise APIError(503, "no slot available", "unavailable_error")
    return [_slot_json(s, x) for x in info]


def _slot_json(s, x: dict) -> dict:
    """llama-server's slot object: the task fields only once the slot has run one, and the
    task's `params` as its metrics subset (prompt and generated text are not shown)."""
    out = {
        "id": x["id"],
        "n_ctx": x["n_ctx"],
        "speculative": False,
        "is_processing": x["is_processing"],
    }
    req = x["request"]
    if req is None:
        return out
    gen = req if isinstance(req, GenerationRequest) else None
    n_predict = gen.n_predict if gen is not None else -1
    busy = x["is_processing"]
    n_decoded = x["n_decoded"] if busy else 0  # an idle slot shows no leftover budget
    out.update(
        {
            "id_task": x["id_task"],
            "n_prompt_tokens": x["n_prompt_tokens"],
            "n_prompt_tokens_processed": max(
                0, x["n_prompt_tokens_processed"] - x["n_prompt_tokens_cache"]
            ),
            "n_prompt_tokens_cache": x["n_prompt_tokens_cache"],
            "params": rq.generation_settings(s, gen),
            "next_token": [
                {
                    "has_next_token": busy,
                    "has_new_line": False,
                    "n_remain": n_predict - n_decoded if busy and n_predict >= 0 else -1,
                    "n_decoded": n_decoded,
                }
            ],
        }
    )
    return out


@router.get("/metrics")
async def metrics(request: Request):
    s = server_state(request)
    if not s.options.metrics:
        raise not_supported(
            "This server does not support metrics endpoint. Start it with `--metrics`"
        )
    return PlainTextResponse(
        prometheus_text(s, request.app.state),
        media_type="text/plain; version=0.0.4",
        headers={"Process-Start-Time-Unix": str(int(s.t_start))},
    )


def prometheus_text(s, app_state) -> str:
    """llama-server's /metrics: cumulative counters, then gauges. The two throughput gauges
    cover the time since the previous scrape (llama-server resets its buckets on each)."""
    m = s.scheduler.metrics
    last = getattr(app_state, "metrics_last", None) or (0, 0.0, 0, 0.0)
    app_state.metrics_last = (
        m.n_prompt_tokens_total,
        m.t_prompt_s_total,
        m.n_tokens_predicted_total,
        m.t_predicted_s_total,
    )
    d_prompt, dt_prompt = m.n_prompt_tokens_total - last[0], m.t_prompt_s_total - last[1]
    d_pred, dt_pred = m.n_tokens_predicted_total - last[2], m.t_predicted_s_total - last[3]
    counters = [
        (
            "prompt_tokens_total",
            "Number of prompt tokens processed, excluding cached tokens",
            m.n_prompt_tokens_total,
        ),
        (
            "prompt_tokens_cached_total",
            "Number of prompt tokens reused from the cache",
            m.n_prompt_tokens_cached_total,
        ),
        ("prompt_seconds_total", "Total time spent processing prompts", m.t_prompt_s_total),
        (
            "tokens_predicted_total",
            "Number of generation tokens processed",
            m.n_tokens_predicted_total,
        ),
        (
            "tokens_predicted_seconds_total",
            "Total time spent generating tokens",
            m.t_predicted_s_total,
        ),
        (
            "n_decode_total",
            "Total number of llama_decode() calls, excluding speculative decoding and "
            "multimodal decoding",
            m.n_decode_total,
        ),
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)", m.n_tokens_max),
        ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", 0),
        (
            "spec_decode_num_accepted_tokens_total",
            "Speculative: Total draft tokens accepted by the target model",
            0,
        ),
        (
            "spec_decode_num_drafts_total",
            "Speculative: Total speculative decoding verification steps",
            0,
        ),
    ]
    gauges = [
        (
            "prompt_tokens_seconds",
            "Average prompt throughput in tokens/s",
            d_prompt / dt_prompt if dt_prompt > 0 else 0.0,
        ),
        (
            "predicted_tokens_seconds",
            "Average generation throughput in tokens/s",
            d_pred / dt_pred if dt_pred > 0 else 0.0,
        ),
        ("requests_processing", "Number of requests processing", s.scheduler.n_busy()),
        ("requests_deferred", "Number of requests deferred", s.scheduler.n_pending()),
        (
            "n_busy_slots_per_decode",
            "Average number of busy slots per llama_decode() call",
            m.n_busy_slots_total / max(m.n_decode_total, 1),
        ),
    ]
    lines = []
    for kind, rows in (("counter", counters), ("gauge", gauges)):
        for name, help_, value in rows:
            lines += [
                f"# HELP llamacpp:{name} {help_}",
                f"# TYPE llamacpp:{name} {kind}",
                f"llamacpp:{name} {value if isinstance(value, int) else format(value, '.9g')}",
            ]
    return "\n".join(lines) + "\n"


def _token_text(tok: ServerTokenizer, token: int | None) -> str:
    if token is None or not 0 <= token < tok.n_vocab:
        return ""
    return tok.token_to_piece(token).decode("utf-8", "replace")


@router.get("/")
async def root(request: Request):
    s = server_state(request)
    return {
        "name": "ggstation",
        "model": s.model_alias,
        "endpoints": [
            "/v1/chat/completions",
            "/v1/completions",
            "/completion",
            "/v1/embeddings",
            "/tokenize",
            "/detokenize",
            "/apply-template",
            "/props",
            "/slots",
            "/metrics",
            "/health",
            "/v1/models",
        ],
    }


# -- the files a browser asks for ---------------------------------------------------------------
# ggstation has no web UI. A browser that used llama-server's UI on this address keeps its
# service worker and revalidates these; like llama-server without its UI, the worker it gets
# removes itself. They are public (no API key), as llama-server's UI assets are.

_SW_REMOVE_JS = """self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil((async () => {
    await self.registration.unregister();
    for (const key of await caches.keys()) await caches.delete(key);
    for (const c of await self.clients.matchAll({ type: 'window' })) c.navigate(c.url);
})()));
"""
_NO_CACHE = {"Cache-Control": "no-cache"}


@router.get("/sw.js", include_in_schema=False)
async def service_worker():
    return Response(_SW_REMOVE_JS, media_type="application/javascript", headers=_NO_CACHE)


@router.get("/manifest.webmanifest", include_in_schema=False)
async def web_manifest():
    return JSONResponse(
        {
            "name": "ggstation",
            "short_name": "ggstation",
            "start_url": "/",
            "display": "standalone",
            "icons": [],
        },
        media_type="application/manifest+json",
        headers=_NO_CACHE,
    )


@router.get("/_app/version.json", include_in_schema=False)
async def ui_version():
    return JSONResponse({"version": __version__}, headers=_NO_CACHE)
