"""qwen2: llama with biases on Q/K/V and NEOX rope (rotate halves)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig, base_config
from ..gguf_file import GGUFFile
from . import llama
from .base import Architecture, bind_layer
from .spec import DecoderSpec, LayerSpec


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


ARCH = Architecture("qwen2", config_from_gguf, load_layer, DecoderSpec(LayerSpec(qkv_bias=True)))
