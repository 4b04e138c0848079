"""Float64 numpy oracles, one per architecture, written from llama.cpp's definitions and
independent of the engine (they read the GGUF with gguf-py only)."""

from __future__ import annotations

import numpy as np

from . import gemma2, gemma3, granite, llama, olmo2, phi3, qwen2, qwen3, smollm3
from .common import GGUFModel

ORACLES = {
    "llama": llama, "qwen2": qwen2, "qwen3": qwen3, "gemma2": gemma2, "gemma3": gemma3, "phi3": phi3,
    "smollm3": smollm3, "olmo2": olmo2, "granite": granite,
}


def oracle_logits(path, tokens, n_ctx_seq: int) -> np.ndarray:
    """(len(tokens), n_vocab) float64 logits of one sequence from position 0, in a context of
    n_ctx_seq positions per sequence (LongRoPE picks its factors by it)."""
    m = GGUFModel(path)
    return ORACLES[m.arch].forward(m, np.asarray(tokens), n_ctx_seq)
