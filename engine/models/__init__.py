"""Architecture registry keyed by `general.architecture`; aliases map in one dict."""

from __future__ import annotations

from types import ModuleType

from ..errors import UnsupportedArchError
from . import gemma3, llama, qwen2, qwen3

ARCHITECTURES: dict[str, ModuleType] = {
    "llama": llama,
    "qwen2": qwen2,
    "qwen3": qwen3,
    "gemma3": gemma3,
}
ARCH_ALIASES = {"mistral": "llama"}


def get_arch(name: str) -> ModuleType:
    key = ARCH_ALIASES.get(name, name)
    if key not in ARCHITECTURES:
        raise UnsupportedArchError(
            f"unknown model architecture '{name}' (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return ARCHITECTURES[key]
