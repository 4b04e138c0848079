"""The error body every endpoint returns, {"error": {"code", "message", "type"}}: engine
errors mapped to HTTP by class, and the shortcuts routes use (APIError lives in engine.errors).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.responses import JSONResponse

from ..errors import (
    APIError,
    ContextOverflowError,
    EngineError,
    InvalidRequestError,
    SchedulerStoppedError,
)

log = logging.getLogger(__name__)


def api_response(e: APIError) -> JSONResponse:
    """The JSON response for an APIError (with the auth challenge header on a 401)."""
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def invalid(message: str, **extra) -> APIError:
    return APIError(400, message, **extra)


def not_supported(message: str) -> APIError:
    return APIError(501, message)


def loading() -> APIError:
    return APIError(503, "Loading model")


def exceed_context(n_prompt: int, n_ctx: int, at_least: bool = False) -> APIError:
    """llama-server's 400 for a prompt over a slot's context; `at_least` when the count is a
    lower bound from the text's size (the prompt was not tokenized)."""
    return APIError(
        400,
        f"the request exceeds the available context size: the prompt has {'at least ' if at_least else ''}"
        f"{n_prompt} tokens, "
        f"the context of a slot holds {n_ctx}; use a shorter prompt or raise -c/--ctx-size",
        "exceed_context_size_error",
        n_prompt_tokens=n_prompt,
        n_ctx=n_ctx,
    )


def api_error(e: BaseException) -> APIError:
    """The HTTP error for an exception, by class: the caller's fault is a 400, a shutdown a
    503, an engine failure a 500 with the engine's message. Anything else is a bug in our
    own code: a 500 and a log line with the traceback, never a 400."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ContextOverflowError):
        return exceed_context(e.n_prompt, e.n_ctx)
    if isinstance(e, InvalidRequestError):
        return invalid(str(e))
    if isinstance(e, SchedulerStoppedError):
        return APIError(503, str(e) or "server is shutting down")
    if isinstance(e, EngineError):
        return APIError(500, str(e))
    log.error("internal error: %s: %s", type(e).__name__, e, exc_info=e)
    return APIError(500, f"internal server error: {type(e).__name__}: {e}")


def error_response(status: int, message: str, type: str | None = None) -> JSONResponse:
    return api_response(APIError(status, message, type))


def format_validation_errors(errors: Sequence[Mapping[str, Any]]) -> str:
    """pydantic errors -> one readable line: `messages.0.role: Input should be ...; ...`."""
    parts = []
    for e in errors[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x not in ("body",))
        msg = e.get("msg", "invalid value")
        if e.get("type") == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}" if loc else msg)
    if len(errors) > 5:
        parts.append(f"... and {len(errors) - 5} more")
    return "invalid request: " + "; ".join(parts)
