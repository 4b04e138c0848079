"""Architecture registry keyed by `general.architecture`; aliases map in one dict.

An architecture is one module here (llama.py, gemma2.py, ...) providing
    config_from_gguf(f) -> ModelConfig         its hyper-parameters (a ModelConfig subclass
                                               when it has parameters of its own)
    load_layer(f, cfg, il) -> its layer dataclass, attributes named as GGUF tensors
    block(s, il, lw)                           one layer on a ubatch, s.x updated in place
and, where they differ from the shared ones in layers.py,
    embed(s, w)                                token embeddings into s.x
    head(s, w, out, embeddings)                final norm and logits of the output rows
Adding an architecture is one module plus one line in ARCHITECTURES.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from ..errors import UnsupportedArchError
from . import gemma2, gemma3, layers, llama, phi3, qwen2, qwen3


@dataclass(frozen=True)
class Architecture:
    name: str
    config_from_gguf: Callable
    load_layer: Callable
    block: Callable
    embed: Callable = layers.embed
    head: Callable = layers.head

    @classmethod
    def from_module(cls, name: str, module: ModuleType) -> Architecture:
        hooks = ("config_from_gguf", "load_layer", "block", "embed", "head")
        return cls(name, **{h: getattr(module, h) for h in hooks if hasattr(module, h)})


ARCHITECTURES: dict[str, Architecture] = {
    name: Architecture.from_module(name, module)
    for name, module in {
        "llama": llama,
        "qwen2": qwen2,
        "qwen3": qwen3,
        "gemma2": gemma2,
        "gemma3": gemma3,
        "phi3": phi3,
    }.items()
}
ARCH_ALIASES = {"mistral": "llama"}


def get_arch(name: str) -> Architecture:
    key = ARCH_ALIASES.get(name, name)
    if key not in ARCHITECTURES:
        raise UnsupportedArchError(
            f"unknown model architecture '{name}' (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return ARCHITECTURES[key]
