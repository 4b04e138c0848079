"""qwen2: llama with biases on Q/K/V and NEOX rope (rotate halves)."""

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
    """llama's tensors plus biases on the Q, K and V projections."""

    attn_q_bias: np.ndarray
    attn_k_bias: np.ndarray
    attn_v_bias: np.ndarray


def load_layer(f: GGUFFile, cfg: ModelConfig, il: int) -> Layer:
    return bind_layer(f, cfg, il, Layer)


def block(s: L.UbatchState, il: int, lw: Layer) -> None:
    h = L.norm(s, s.x, lw.attn_norm)
    q, k, v = L.qkv(s, h, lw.attn_q, lw.attn_k, lw.attn_v,
                    lw.attn_q_bias, lw.attn_k_bias, lw.attn_v_bias)
    s.x += L.attention(s, il, q, k, v, lw.attn_output)
    s.x += L.ffn(s, L.norm(s, s.x, lw.ffn_norm), lw.ffn_gate, lw.ffn_up, lw.ffn_down, "silu")


ARCH = Architecture("qwen2", config_from_gguf, load_layer, block, step=StepSpec(qkv_bias=True))
