"""Every exception the engine raises on purpose; all derive from EngineError.

Callers map errors by class: the HTTP server turns `InvalidRequestError` (and its subclass
`ContextOverflowError`) into 400s, `SchedulerStoppedError` into 503 and any other
`EngineError` into a 500 with the engine's message. Anything that is not an EngineError
(`ValueError`, `KeyError`, ... from our own code) is a bug: a 500 with a log line.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class for all errors the engine reports to callers."""


class GGUFError(EngineError):
    """A GGUF file is missing, truncated, malformed or hostile."""


class MissingTensorError(GGUFError):
    """A tensor the architecture needs is absent or has the wrong shape."""


class UnsupportedArchError(EngineError):
    """The model's `general.architecture` has no implementation here."""


class UnsupportedQuantError(EngineError):
    """A tensor uses a quantisation type the engine cannot compute with."""


class TokenizerError(EngineError):
    """The tokenizer metadata is missing or unsupported."""


class TemplateError(EngineError):
    """A chat template failed to parse or render."""


class ModelStoreError(EngineError):
    """A starter model could not be fetched, verified or found."""


class InvalidRequestError(EngineError):
    """A request the engine cannot serve as asked: empty prompt, token id out of range,
    unknown slot or pooling type. The caller's input is at fault, not the engine."""


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


class SchedulerStoppedError(EngineError):
    """The scheduler is shutting down and accepts no new requests."""


class PortInUseError(EngineError):
    """The HTTP server's port is taken by another program."""


class RouterError(EngineError):
    """Router mode could not start, stop or reach a child server."""


class UnknownModelError(RouterError):
    """The router has no model of that name."""
