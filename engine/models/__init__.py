"""Architecture registry keyed by `general.architecture`; aliases map in one dict.

An architecture is one module here (llama.py, gemma2.py, ...) ending in its record,
`ARCH = Architecture(name, config_from_gguf, load_layer, DecoderSpec(...))`
(engine/models/base.py, models/spec.py). The registry finds every module of this package
that has an ARCH, so adding an architecture is that one module (and its oracle,
tests/oracles/<arch>.py); docs/adding-an-architecture.md says what goes in it.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..errors import UnsupportedArchError
from .base import Architecture


def _discover() -> dict[str, Architecture]:
    """The ARCH of every module of this package that has one, by name, in module order."""
    found: dict[str, Architecture] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        arch = getattr(importlib.import_module(f"{__name__}.{info.name}"), "ARCH", None)
        if isinstance(arch, Architecture):
            if arch.name in found:
                raise RuntimeError(f"two modules declare the architecture {arch.name!r}")
            found[arch.name] = arch
    return found


ARCHITECTURES: dict[str, Architecture] = _discover()
ARCH_ALIASES = {"mistral": "llama"}


def get_arch(name: str) -> Architecture:
    key = ARCH_ALIASES.get(name, name)
    if key not in ARCHITECTURES:
        raise UnsupportedArchError(
            f"unknown model architecture '{name}' (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return ARCHITECTURES[key]
