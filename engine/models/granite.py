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

from ..config import Rope, base_config, require_whole_head_rope
from ..errors import UnsupportedArchError
from ..gguf_file import GGUFFile
from .base import Architecture, rope_factors
from .llama import LlamaConfig, load_layer
from .spec import DecoderSpec, LayerSpec

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
            raise UnsupportedArchError(
                f"{f.path}: granite with bias tensors (blk.0.{name}.bias) is not supported"
            )
    return replace(cfg, rope_freqs=rope_factors(f, cfg, "rope_freqs.weight"))


SPEC = DecoderSpec(LayerSpec(residual_scale=True), embed_scale="embedding_scale", logit_scale=True)
ARCH = Architecture("granite", config_from_gguf, load_layer, SPEC)
