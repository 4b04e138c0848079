"""llama: Llama 1/2/3, SmolLM2, TinyLlama, Mistral. RMSNorm, SwiGLU, RoPE on adjacent pairs.

The GGUF converter permutes Q/K rows so that llama.cpp's NORM rope (pairs 2i, 2i+1) applies.
Llama 3.1+ files carry `rope_freqs.weight`: per-pair frequency divisors (its "llama3" RoPE
scaling), applied to every layer as llama.cpp does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..config import ModelConfig, base_config
from ..gguf_file import GGUFFile
from ..quants import QTensor
from .base import Architecture, bind_layer, rope_factors


@dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    rope_freqs: tuple[float, ...] = ()  # rope_freqs.weight (Llama 3.1+)

    def rope_factors(self, n_ctx_seq: int) -> tuple[float, ...]:
        return self.rope_freqs


def config_from_gguf(f: GGUFFile) -> LlamaConfig:
    cfg = base_config(f, LlamaConfig, rope_neox=False)
    return replace(cfg, rope_freqs=rope_factors(f, cfg, "rope_freqs.weight"))


@dataclass
class Layer:
    attn_norm: np.ndarray
    attn_q: QTensor
    attn_k: QTensor
    attn_v: QTensor
    attn_output: QTensor
    ffn_norm: np.ndarray
    ffn_gate: QTensor
    ffn_up: QTensor
    ffn_down: QTensor


def load_layer(f: GGUFFile, cfg: ModelConfig, il: int) -> Layer:
    return bind_layer(f, cfg, il, Layer)


# the standard layer: x += attn(norm(x)); x += ffn(norm(x)) with SwiGLU (models/spec.py)
ARCH = Architecture("llama", config_from_gguf, load_layer)
