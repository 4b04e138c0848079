"""olmo2: OLMo 2 and OLMo 3. Norms after the sublayers instead of before them: the attention
output goes through post_attention_norm, the FFN output through post_ffw_norm, each before its
residual add, and the sublayers read the residual stream unnormalised. RMSNorm of Q and of K
over the whole projection (n_head * head_dim and n_head_kv * head_dim weights, not per head)
before NEOX RoPE, SwiGLU, queries scaled by 1/sqrt(head_dim).

OLMo 3 files carry attention.sliding_window (and a per-layer sliding_window_pattern, else
llama.cpp's period 4: every 4th layer global) and YaRN rope scaling. As llama.cpp's graph
(src/models/olmo2.cpp), sliding layers turn by rope.freq_base with no position scaling and no
attention factor, and global layers use the file's rope scaling (YaRN or linear, as
config.base_config reads it for every architecture). llama.cpp reads rope.freq_base_swa for
olmo2 but its graph does not use it (only its context shift does); OLMo 3's converter does not
write it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ModelConfig, Rope, base_config, require_whole_head_rope, swa_layers
from ..gguf_file import GGUFFile
from ..quants import QTensor
from .base import Architecture, bind_layer
from .spec import DecoderSpec, LayerSpec

SWA_PATTERN = 4  # llama.cpp load_swa_pattern(ml, 4): layers 3, 7, ... are global


@dataclass(frozen=True)
class Olmo2Config(ModelConfig):
    def layer_rope(self, il: int, n_ctx_seq: int) -> Rope:
        if self.is_swa(il):  # plain RoPE: freq_scale 1, ext_factor 0, attn_factor 1 (olmo2.cpp)
            return Rope.make(self.rope_dim, self.rope_base, self.rope_neox)
        return super().layer_rope(il, n_ctx_seq)


def config_from_gguf(f: GGUFFile) -> Olmo2Config:
    k = lambda s: f"{f.arch}.{s}"
    window = f.get_int(k("attention.sliding_window"), 0)
    extra: dict[str, Any] = {}
    if window > 0:
        extra.update(
            sliding_window=window, swa_layers=swa_layers(f, SWA_PATTERN), rope_scale_swa=1.0
        )
    cfg = base_config(f, Olmo2Config, rope_neox=True, **extra)
    require_whole_head_rope(f, cfg)
    return cfg


@dataclass
class Layer:
    attn_q: QTensor
    attn_k: QTensor
    attn_v: QTensor
    attn_q_norm: np.ndarray  # n_head * head_dim
    attn_k_norm: np.ndarray  # n_head_kv * head_dim
    attn_output: QTensor
    post_attention_norm: np.ndarray
    ffn_gate: QTensor
    ffn_up: QTensor
    ffn_down: QTensor
    post_ffw_norm: np.ndarray


def load_layer(f: GGUFFile, cfg: ModelConfig, il: int) -> Layer:
    D = cfg.head_dim
    return bind_layer(
        f, cfg, il, Layer, attn_q_norm=(cfg.n_head * D,), attn_k_norm=(cfg.n_head_kv * D,)
    )


ARCH = Architecture(
    "olmo2",
    config_from_gguf,
    load_layer,
    DecoderSpec(LayerSpec(qk_norm="whole", pre_norms=False, post_norms=True)),
)
