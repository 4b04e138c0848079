"""granite: IBM Granite 3.x dense models. llama's block (RMSNorm, SwiGLU, NORM RoPE) with four
scalar multipliers: token embeddings times embedding_scale, each block's attention and FFN
outputs times residual_scale before their residual adds, queries scaled by attention.scale
instead of 1/sqrt(head_dim), and logits divided by logit_scale.

As llama.cpp (src/models/granite.cpp): logit_scale is required, the other three are optional
(0 or absent: no scaling, 1/sqrt(head_dim)); rope.scaling.finetuned (default true) switches
RoPE on for every layer, false leaves all layers unrotated; rope_freqs.weight divisors apply
when present. Bias tensors (optional in llama.cpp) are not supported and are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..config import Rope, base_config, require_whole_head_rope
from ..errors import UnsupportedArchError
from ..gguf_file import GGUFFile
from . import layers as L
from .base import Architecture, rope_factors
from .llama import Layer, LlamaConfig, load_layer
from .step import StepSpec

# scalar multipliers: 0 means "not set" for all but logit_scale, a divisor
SCALE_RANGE = (0.0, 1e6)
BIASES = ("attn_output", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(frozen=True)
class GraniteConfig(LlamaConfig):
    embedding_scale: float = 0.0
    residual_scale: float = 0.0
    logit_scale: float = 1.0
    use_rope: bool = True  # rope.scaling.finetuned

    def layer_rope(self, il: int, n_ctx_seq: int) -> Rope:
        if not self.use_rope:
            return Rope.make(0, self.rope_base, self.rope_neox)
        return super().layer_rope(il, n_ctx_seq)


def config_from_gguf(f: GGUFFile) -> GraniteConfig:
    k = lambda s: f"{f.arch}.{s}"
    lo, hi = SCALE_RANGE
    cfg = base_config(
        f,
        GraniteConfig,
        rope_neox=False,
        attn_scale=f.get_float(k("attention.scale"), 0.0, lo=lo, hi=hi),
        embedding_scale=f.get_float(k("embedding_scale"), 0.0, lo=lo, hi=hi),
        residual_scale=f.get_float(k("residual_scale"), 0.0, lo=lo, hi=hi),
        logit_scale=f.get_float(k("logit_scale"), lo=1e-6, hi=hi),
        use_rope=f.get_bool(k("rope.scaling.finetuned"), True),
    )
    require_whole_head_rope(f, cfg)
    for name in BIASES:
        if f"blk.0.{name}.bias" in f.tensors:
            raise UnsupportedArchError(f"{f.path}: granite with bias tensors (blk.0.{name}.bias) is not supported")
    return replace(cfg, rope_freqs=rope_factors(f, cfg, "rope_freqs.weight"))


def embed(s: L.UbatchState, w) -> None:
    L.embed(s, w, s.cfg.embedding_scale or 1.0)


def head(s: L.UbatchState, w, out: np.ndarray, embeddings: bool) -> None:
    L.head(s, w, out, embeddings)
    if not embeddings:  # llama.cpp scales the logits only, not the embeddings it returns
        out /= np.float32(s.cfg.logit_scale)


def _residual(s: L.UbatchState, o: np.ndarray) -> np.ndarray:
    if s.cfg.residual_scale:
        o *= np.float32(s.cfg.residual_scale)
    return o


def block(s: L.UbatchState, il: int, lw: Layer) -> None:
    q, k, v = L.qkv(s, L.norm(s, s.x, lw.attn_norm), lw.attn_q, lw.attn_k, lw.attn_v)
    s.x += _residual(s, L.attention(s, il, q, k, v, lw.attn_output))
    s.x += _residual(s, L.ffn(s, L.norm(s, s.x, lw.ffn_norm), lw.ffn_gate, lw.ffn_up, lw.ffn_down, "silu"))


ARCH = Architecture("granite", config_from_gguf, load_layer, block, embed=embed, head=head,
                    step=StepSpec(residual_scale=True))
