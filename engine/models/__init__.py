"""Architecture registry keyed by `general.architecture`; aliases map in one dict.

An architecture is one module here (llama.py, gemma2.py, ...) ending in its record,
`ARCH = Architecture(name, config_from_gguf, load_layer, block[, embed, head])`
(engine/models/base.py). Adding an architecture is one module plus its name in the tuple
below.
"""

from __future__ import annotations

from ..errors import UnsupportedArchError
from . import gemma2, gemma3, granite, llama, olmo2, phi3, qwen2, qwen3, smollm3
from .base import Architecture

ARCHITECTURES: dict[str, Architecture] = {
    m.ARCH.name: m.ARCH for m in (llama, qwen2, qwen3, gemma2, gemma3, phi3, smollm3, olmo2, granite)
}
ARCH_ALIASES = {"mistral": "llama"}


def get_arch(name: str) -> Architecture:
    key = ARCH_ALIASES.get(name, name)
    if key not in ARCHITECTURES:
        raise UnsupportedArchError(
            f"unknown model architecture '{name}' (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return ARCHITECTURES[key]
