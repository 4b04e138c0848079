"""The app's own errors, and the plain words the user sees for any error.

Engine errors are matched by class (engine.errors), never by class name: a look-alike class
from elsewhere gets no engine wording, and a renamed engine class fails at import, not silently.
"""

from __future__ import annotations

from engine.errors import (
    ContextOverflowError,
    GGUFError,
    HubError,
    InsufficientMemoryError,
    MetadataError,
    MissingTensorError,
    ModelStoreError,
    PortInUseError,
    RemoteError,
    SchedulerStoppedError,
    TemplateError,
    TokenizerError,
    UnsupportedArchError,
    UnsupportedQuantError,
)


class AppError(Exception):
    """An error the app reports to the user in plain words."""


class LoadCancelled(AppError):
    """The user cancelled a model load or a download."""


# Looked up along the error's MRO, so a subclass (MissingTensorError) gets its own words
# before its base's (GGUFError).
_PLAIN: dict[type[BaseException], str] = {
    GGUFError: "This file is not a usable GGUF model",
    MissingTensorError: "The model file is missing a tensor the architecture needs",
    MetadataError: "The model file's metadata is damaged or of the wrong type",
    InsufficientMemoryError: "This model does not fit in the memory this machine has free",
    HubError: "Hugging Face could not provide the model",
    UnsupportedArchError: "This model's architecture is not supported yet",
    UnsupportedQuantError: "This model uses a quantisation type the engine cannot run",
    TokenizerError: "The model's tokenizer is missing or unsupported",
    TemplateError: "The model's chat template could not be used",
    ContextOverflowError: "The conversation does not fit in the context",
    MemoryError: "Not enough memory",
    ModelStoreError: "The model could not be downloaded",
    PortInUseError: "The server's port is already in use",
    SchedulerStoppedError: "The model is being unloaded",
    FileNotFoundError: "File not found",
    RemoteError: "The remote server could not be used",
}


def plain_error(e: BaseException) -> str:
    """Plain words first, then the engine's own message."""
    for cls in type(e).__mro__:
        if cls in _PLAIN:
            return f"{_PLAIN[cls]}.\n\n{e}".rstrip()
    if isinstance(e, AppError):
        return str(e)
    return f"{type(e).__name__}: {e}"
