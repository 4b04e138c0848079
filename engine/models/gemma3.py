"""gemma3: sqrt(n_embd) embedding scale, Q/K norms, post-attention and post-FFN norms,
GELU-gated FFN, sliding-window layers (5 of every 6) with their own RoPE base.

The GGUF converter already adds Gemma's +1 to every norm weight, so plain RMSNorm applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig, base_config, swa_layers
from ..gguf_file import GGUFFile
from . import gemma2
from .base import Architecture, bind_layer
from .spec import DecoderSpec, LayerSpec

SWA_PATTERN = 6  # llama.cpp: every 6th layer is global, the others slide
ROPE_BASE_SWA = 10000.0  # llama.cpp's default when the GGUF has no rope.freq_base_swa


@dataclass(frozen=True)
class Gemma3Config(ModelConfig):
    final_logit_softcap: float = 0.0


def config_from_gguf(f: GGUFFile) -> Gemma3Config:
    arch = f.arch
    n_layer = f.get_int(f"{arch}.block_count")
    n_embd = f.get_int(f"{arch}.embedding_length")
    n_head = f.get_int(f"{arch}.attention.head_count")
    head_dim = f.get_int(f"{arch}.attention.key_length", n_embd // max(n_head, 1))
    window = f.get_int(f"{arch}.attention.sliding_window", 0) or 0
    return base_config(
        f,
        Gemma3Config,
        rope_neox=True,
        rope_base_swa=f.get_float(f"{arch}.rope.freq_base_swa", ROPE_BASE_SWA),
        rope_scale_swa=1.0,  # sliding layers keep unscaled positions
        sliding_window=window,
        swa_layers=swa_layers(f, SWA_PATTERN) if window else (),
        # 27B scales queries by 1/sqrt(n_embd/n_head); the others by 1/sqrt(head_dim).
        attn_scale=1.0 / math.sqrt(n_embd / n_head if n_layer == 62 else head_dim),
        final_logit_softcap=f.get_float(f"{arch}.final_logit_softcapping", 0.0) or 0.0,
    )


@dataclass
class Layer(gemma2.Layer):
    """gemma2's tensors plus per-head RMSNorm weights for Q and K."""

    attn_q_norm: np.ndarray
    attn_k_norm: np.ndarray


def load_layer(f: GGUFFile, cfg: ModelConfig, il: int) -> Layer:
    return bind_layer(f, cfg, il, Layer)


# as gemma2 with per-head Q/K norms and no attention soft-cap: embeddings scaled by
# sqrt(n_embd), final logits soft-capped when the file says so
SPEC = DecoderSpec(
    LayerSpec(qk_norm="head", post_norms=True, act="gelu"),
    embed_scale="sqrt_n_embd",
    final_softcap=True,
)
ARCH = Architecture("gemma3", config_from_gguf, load_layer, SPEC)
