"""qwen3: llama with per-head RMSNorm on Q and K before RoPE, NEOX rope, no biases."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig, base_config
from ..gguf_file import GGUFFile
from . import layers as L
from . import llama
from .base import Architecture, bind_layer
from .step import StepSpec


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    return base_config(f, rope_neox=True)


@dataclass
class Layer(llama.Layer):
    """llama's tensors plus per-head RMSNorm weights for Q and K."""

    attn_q_norm: np.ndarray
    attn_k_norm: np.ndarray


def load_layer(f: GGUFFile, cfg: ModelConfig, il: int) -> Layer:
    return bind_layer(f, cfg, il, Layer)


def block(s: L.UbatchState, il: int, lw: Layer) -> None:
    q, k, v = L.qkv(s, L.norm(s, s.x, lw.attn_norm), lw.attn_q, lw.attn_k, lw.attn_v)
    L.norm_heads(s, q, lw.attn_q_norm)
    L.norm_heads(s, k, lw.attn_k_norm)
    s.x += L.attention(s, il, q, k, v, lw.attn_output)
    s.x += L.ffn(s, L.norm(s, s.x, lw.ffn_norm), lw.ffn_gate, lw.ffn_up, lw.ffn_down, "silu")


ARCH = Architecture("qwen3", config_from_gguf, load_layer, block, step=StepSpec(qk_norm="head"))
