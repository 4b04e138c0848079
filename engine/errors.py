"""Engine exception hierarchy: every error the engine raises on bad input derives from EngineError."""


class EngineError(Exception):
    """Base class for all errors the engine reports to callers."""


class GGUFError(EngineError):
    """A GGUF file is missing, truncated, malformed or hostile."""


class UnsupportedArchError(EngineError):
    """The model's `general.architecture` has no implementation here."""


class UnsupportedQuantError(EngineError):
    """A tensor uses a quantisation type the engine cannot compute with."""


class MissingTensorError(GGUFError):
    """A tensor the architecture needs is absent or has the wrong shape."""


class ContextOverflowError(EngineError):
    """A sequence would not fit in its share of the KV cache."""


class TokenizerError(EngineError):
    """The tokenizer metadata is missing or unsupported."""


class TemplateError(EngineError):
    """A chat template failed to parse or render."""


class ModelStoreError(EngineError):
    """A starter model could not be fetched, verified or found."""
