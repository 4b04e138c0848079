"""qwen3: llama with per-head RMSNorm on Q and K before RoPE, NEOX rope, no biases."""

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
    """llama's tensors plus per-head RMSNorm weights for Q and K."""

    attn_q_norm: np.ndarray
    attn_k_norm: np.ndarray


def load_layer(f: GGUFFile, cfg: ModelConfig, il: int) -> Layer:
    return bind_layer(f, cfg, il, Layer)


ARCH = Architecture("qwen3", config_from_gguf, load_layer, DecoderSpec(LayerSpec(qk_norm="head")))
