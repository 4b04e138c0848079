"""APIError and the error body every endpoint returns: {"error": {"code", "message", "type"}}.

The types are llama-server's (tools/server/utils.hpp format_error_response), which are
also the OpenAI names where OpenAI has one.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class APIError(Exception):
    """An error to send to the client as-is.

    Args:
        status: HTTP status code.
        message: what went wrong, in words a user can act on.
        type: error type (default from the status).
        extra: additional fields inside "error" (e.g. n_prompt_tokens, n_ctx, param).
    """

    def __init__(self, status: int, message: str, type: str | None = None, **extra: Any):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or ERROR_TYPES.get(status, "server_error")
        self.extra = extra

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message, "type": self.type, **self.extra}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def invalid(message: str, **extra) -> APIError:
    return APIError(400, message, **extra)


def not_supported(message: str) -> APIError:
    return APIError(501, message)


def loading() -> APIError:
    return APIError(503, "Loading model")


def exceed_context(n_prompt: int, n_ctx: int) -> APIError:
    return APIError(
        400,
        f"the request exceeds the available context size: the prompt has {n_prompt} tokens, "
        f"the context of a slot holds {n_ctx}; use a shorter prompt or raise -c/--ctx-size",
        "exceed_context_size_error",
        n_prompt_tokens=n_prompt,
        n_ctx=n_ctx,
    )


def error_response(status: int, message: str, type: str | None = None) -> JSONResponse:
    return APIError(status, message, type).response()


def format_validation_errors(errors: list[dict]) -> str:
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
