"""Every exception the engine raises on purpose; all derive from EngineError.

Callers map errors by class: the HTTP server turns `InvalidRequestError` (and its subclass
`ContextOverflowError`) into 400s, `SchedulerStoppedError` into 503 and any other
`EngineError` into a 500 with the engine's message. Anything that is not an EngineError
(`ValueError`, `KeyError`, ... from our own code) is a bug: a 500 with a log line.
"""

from __future__ import annotations

from typing import Any


class EngineError(Exception):
    """Base class for all errors the engine reports to callers."""


class GGUFError(EngineError):
    """A GGUF file is missing, truncated, malformed or hostile."""


class MissingTensorError(GGUFError):
    """A tensor the architecture needs is absent or has the wrong shape."""


class MetadataError(GGUFError):
    """A metadata value has the wrong type or an impossible value: the message names the key,
    what was expected and what the file holds."""


class UnsupportedArchError(EngineError):
    """The model's `general.architecture` has no implementation here."""


class UnsupportedQuantError(EngineError):
    """A tensor uses a quantisation type the engine cannot compute with."""


class TokenizerError(EngineError):
    """The tokenizer metadata is missing or unsupported."""


class TemplateError(EngineError):
    """A chat template failed to parse or render."""


class TemplateRefusedError(TemplateError):
    """The chat template itself rejected the conversation (its `raise_exception(...)`), e.g.
    roles that do not alternate: the caller's messages are at fault."""


class TemplateLimitError(TemplateError):
    """A chat template went over a render limit (time, size of its output or of a string or
    list it builds, range() items, call depth). The template is at fault, not the messages:
    the limits grow with the input."""


class InsufficientMemoryError(EngineError):
    """A context (KV cache and compute buffers) would not fit in the memory available.

    Attributes:
        needed_bytes: what the context would allocate (the weights, mapped, not counted).
        available_bytes: available RAM plus free swap when it was checked.
    """

    def __init__(self, message: str, needed_bytes: int = 0, available_bytes: int = 0):
        super().__init__(message)
        self.needed_bytes = int(needed_bytes)
        self.available_bytes = int(available_bytes)


class ModelStoreError(EngineError):
    """A starter model could not be fetched, verified or found."""


class HubError(EngineError):
    """A Hugging Face Hub search, look-up, fit check or download failed (engine/hub/client.py).

    Attributes:
        reason: one of the constants below, for callers that act on the cause (ask for a
            token on AUTH, offer to resume on INTERRUPTED or CANCELLED).
        available: on QUANT_NOT_FOUND, the quant tags the repository has.
    """

    OFFLINE = "offline"  # no network, HF_HUB_OFFLINE=1 and not in the cache
    AUTH = "auth"  # 401/403: gated or private, a token is needed
    NOT_FOUND = "not_found"  # repository, revision or file
    NO_GGUF = "no_gguf"  # the repository has no GGUF model file
    QUANT_NOT_FOUND = "quant_not_found"
    DISK_FULL = "disk_full"
    INTERRUPTED = "interrupted"  # the transfer broke off; the partial file is kept to resume
    CANCELLED = "cancelled"  # by the caller; the partial file is kept to resume
    CORRUPT = "corrupt"  # the downloaded bytes do not match the Hub's size or sha256
    UNSUPPORTED = "unsupported"  # the model's architecture or a tensor type is not supported
    HUB = "hub"  # any other error the Hub answered with

    def __init__(self, message: str, reason: str = HUB, available: tuple[str, ...] = ()):
        super().__init__(message)
        self.reason = reason
        self.available = tuple(available)


class InvalidRequestError(EngineError):
    """A request the engine cannot serve as asked: empty prompt, token id out of range,
    unknown slot or pooling type. The caller's input is at fault, not the engine."""


class GrammarError(InvalidRequestError):
    """A grammar or JSON schema is invalid, or cannot be used with this model's vocabulary:
    the message is the parser's, naming the problem."""


class ContextOverflowError(InvalidRequestError):
    """A prompt does not fit in the context of one sequence.

    Attributes:
        n_prompt: tokens in the prompt.
        n_ctx: positions one sequence may use.
    """

    def __init__(self, n_prompt: int, n_ctx: int, message: str | None = None):
        self.n_prompt = int(n_prompt)
        self.n_ctx = int(n_ctx)
        super().__init__(
            message
            or f"the request exceeds the available context size: the prompt has {self.n_prompt} "
            f"tokens, the context of a sequence holds {self.n_ctx} (it needs at least "
            f"{self.n_prompt + 1}); use a shorter prompt or raise -c/--ctx-size"
        )


class SlotFileError(InvalidRequestError):
    """A slot file that cannot be restored: not a slot file, another model's or cache type's,
    tokens out of range, or more positions than a slot holds."""


class KVCacheFullError(EngineError):
    """The KV cache has no free cells for a batch (llama_decode's return 1): a unified
    cache's shared pool is exhausted. The scheduler frees idle sequences and retries, or
    fails the requests with llama-server's "Context size has been exceeded."."""


class SchedulerStoppedError(EngineError):
    """The scheduler is shutting down and accepts no new requests."""


class PortInUseError(EngineError):
    """The HTTP server's port is taken by another program."""


class RouterError(EngineError):
    """Router mode could not start, stop or reach a child server."""


class UnknownModelError(RouterError):
    """The router has no model of that name."""


class RequestCancelled(RouterError):
    """The client of a request waiting for its model went away."""


class ModelLimitError(RouterError):
    """--models-max models are running and none of them can be stopped now."""


class PresetError(RouterError):
    """The catalogue cannot be built: a malformed preset file, a missing --models-dir, a name
    used twice."""


# llama-server's error types by HTTP status (tools/server/utils.hpp format_error_response),
# which are also OpenAI's names where OpenAI has one.
HTTP_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class APIError(EngineError):
    """An HTTP error to send to the client as-is (engine/server/errors.py renders it).

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
        self.type = type or HTTP_ERROR_TYPES.get(status, "server_error")
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {
            "error": {"code": self.status, "message": self.message, "type": self.type, **self.extra}
        }


class RemoteError(EngineError):
    """A remote OpenAI-compatible server could not be used (engine/remote.py). The message
    names the endpoint and says what to do; `reason` says what kind of failure it was."""

    BAD_URL = "bad_url"  # the URL is not an http(s) address
    UNREACHABLE = "unreachable"  # connection refused, unknown host, TLS failure
    TIMEOUT = "timeout"  # connected, but no answer in time
    AUTH = "auth"  # 401/403: a missing or wrong API key
    NOT_OPENAI = "not_openai"  # answered, but not with OpenAI-shaped JSON
    NOT_FOUND = "not_found"  # 404: the model (or the route) does not exist
    BROKEN = "broken"  # the connection died in the middle of a reply
    SERVER = "server"  # any other error the server answered with

    def __init__(self, message: str, reason: str = SERVER, status: int = 0):
        super().__init__(message)
        self.reason = reason
        self.status = status
