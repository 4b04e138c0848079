"""gemma2: sqrt(n_embd) embedding scale, attention-logit and final-logit soft-capping,
post-attention and post-FFN norms, GELU-gated FFN, sliding-window layers alternating with
global ones (layer 0 slides). No Q/K norm.

The GGUF converter already adds Gemma's +1 to every norm weight, so plain RMSNorm applies.
Defaults when keys are absent are llama.cpp's (src/models/gemma2.cpp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig, base_config, swa_layers
from ..gguf_file import GGUFFile
from ..quants import QTensor
from .base import Architecture, bind_layer
from .spec import DecoderSpec, LayerSpec

SWA_PATTERN = 2  # every 2nd layer is global
SLIDING_WINDOW = 4096
ATTN_SOFTCAP, FINAL_SOFTCAP = 50.0, 30.0


@dataclass(frozen=True)
class Gemma2Config(ModelConfig):
    attn_logit_softcap: float = ATTN_SOFTCAP
    final_logit_softcap: float = FINAL_SOFTCAP


def config_from_gguf(f: GGUFFile) -> Gemma2Config:
    k = lambda s: f"{f.arch}.{s}"
    n_embd, n_head = f.get_int(k("embedding_length")), f.get_int(k("attention.head_count"))
    head_dim = f.get_int(k("attention.key_length"), n_embd // max(n_head, 1))
    n_layer = f.get_int(k("block_count"))
    rope_base = f.get_float(k("rope.freq_base"), 10000.0)
    return base_config(
        f,
        Gemma2Config,
        rope_neox=True,
        rope_base_swa=f.get_float(k("rope.freq_base_swa"), rope_base),
        sliding_window=f.get_int(k("attention.sliding_window"), SLIDING_WINDOW) or SLIDING_WINDOW,
        swa_layers=swa_layers(f, SWA_PATTERN),
        # 27B (46 layers) scales queries by 1/sqrt(n_embd/n_head), the others 1/sqrt(head_dim)
        attn_scale=1.0 / math.sqrt(n_embd / n_head if n_layer == 46 else head_dim),
        attn_logit_softcap=f.get_float(k("attn_logit_softcapping"), ATTN_SOFTCAP),
        final_logit_softcap=f.get_float(k("final_logit_softcapping"), FINAL_SOFTCAP),
    )


@dataclass
class Layer:
    attn_norm: np.ndarray
    attn_q: QTensor
    attn_k: QTensor
    attn_v: QTensor
    attn_output: QTensor
    post_attention_norm: np.ndarray
    ffn_norm: np.ndarray
    ffn_gate: QTensor
    ffn_up: QTensor
    ffn_down: QTensor
    post_ffw_norm: np.ndarray


def load_layer(f: GGUFFile, cfg: ModelConfig, il: int) -> Layer:
    return bind_layer(f, cfg, il, Layer)


SPEC = DecoderSpec(
    LayerSpec(post_norms=True, act="gelu", attn_softcap=True),
    embed_scale="sqrt_n_embd",
    final_softcap=True,
)
ARCH = Architecture("gemma2", config_from_gguf, load_layer, SPEC)
