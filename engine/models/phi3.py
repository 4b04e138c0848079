"""phi3: Phi-3, Phi-3.5, Phi-4-mini. Fused Q|K|V projection, SwiGLU from one fused gate|up
weight, NEOX RoPE on the first rope.dimension_count dims of each head (partial rotary:
Phi-4-mini rotates 3/4), LongRoPE: per-pair frequency divisors rope_factors_short, or
rope_factors_long when the context per sequence exceeds the original training context, and
an attention factor (rope.scaling.attn_factor) multiplying cos and sin.

As llama.cpp (src/models/phi3.cpp): attention.sliding_window is ignored (its Phi SWA is
disabled), queries are scaled by 1/sqrt(head_dim), no biases, output tied to token_embd when
the file has no output.weight.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..config import ModelConfig, base_config
from ..gguf_file import GGUFFile
from ..quants import QTensor
from .base import Architecture, bind_layer, rope_factors
from .spec import DecoderSpec, LayerSpec


@dataclass(frozen=True)
class Phi3Config(ModelConfig):
    n_ctx_orig: int = 0  # rope.scaling.original_context_length
    rope_factors_long: tuple[float, ...] = ()
    rope_factors_short: tuple[float, ...] = ()

    def rope_factors(self, n_ctx_seq: int) -> tuple[float, ...]:
        # llama.cpp get_rope_factors: chosen once per context, so every cached key and every
        # query of a sequence turn alike.
        return self.rope_factors_long if n_ctx_seq > self.n_ctx_orig else self.rope_factors_short


def config_from_gguf(f: GGUFFile) -> Phi3Config:
    k = lambda s: f"{f.arch}.{s}"
    n_ctx_train = f.get_int(k("context_length"), 2048)
    cfg = base_config(
        f,
        Phi3Config,
        rope_neox=True,
        n_ctx_orig=f.get_int(k("rope.scaling.original_context_length"), n_ctx_train) or n_ctx_train,
    )

    qkv_dim = cfg.n_head * cfg.head_dim + cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v)
    return replace(
        cfg,
        rope_factors_long=rope_factors(f, cfg, "rope_factors_long.weight"),
        rope_factors_short=rope_factors(f, cfg, "rope_factors_short.weight"),
        # the fused projections' outputs; SwiGLU writes into "gate" and needs no "up"
        extra_acts=(("qkv", qkv_dim), ("gate_up", 2 * cfg.n_ff), ("up", 0)),
    )


@dataclass
class Layer:
    attn_norm: np.ndarray
    attn_qkv: QTensor  # rows Q | K | V
    attn_output: QTensor
    ffn_norm: np.ndarray
    ffn_up: QTensor  # rows gate | up
    ffn_down: QTensor


def load_layer(f: GGUFFile, cfg: ModelConfig, il: int) -> Layer:
    return bind_layer(f, cfg, il, Layer, ffn_up=(cfg.n_embd, 2 * cfg.n_ff))


ARCH = Architecture("phi3", config_from_gguf, load_layer, DecoderSpec(LayerSpec(fused=True)))
