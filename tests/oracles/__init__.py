"""Float64 numpy oracles, one per architecture, written from llama.cpp's definitions and
independent of the engine (they read the GGUF with gguf-py only)."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import numpy as np

from .common import GGUFModel


def _discover() -> dict[str, ModuleType]:
    """Every module here with a forward(m, tokens, n_ctx_seq), by architecture name (the
    module's, "_" read as "-": gpt_oss.py is "gpt-oss"), so an architecture's oracle is one
    file."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if callable(getattr(mod, "forward", None)):
            found[info.name.replace("_", "-")] = mod
    return found


ORACLES = _discover()


def oracle_logits(path, tokens, n_ctx_seq: int) -> np.ndarray:
    """(len(tokens), n_vocab) float64 logits of one sequence from position 0, in a context of
    n_ctx_seq positions per sequence (LongRoPE picks its factors by it)."""
    m = GGUFModel(path)
    return ORACLES[m.arch].forward(m, np.asarray(tokens), n_ctx_seq)
