"""gpt-oss (OpenAI's open-weight MoE, GGUF architecture "gpt-oss"; llama.cpp
src/models/openai-moe.cpp, LLM_ARCH_OPENAI_MOE).

Attention: Q/K/V and output projections with biases, NEOX RoPE (YaRN in the released files:
rope.scaling.type "yarn", config.Yarn), queries scaled by 1/sqrt(n_rot), a learned sink
logit per head in each softmax denominator (attn_sinks), layers alternating sliding-window
(even layers, attention.sliding_window) and global (llama.cpp's pattern 2).
Feed-forward: a mixture of experts after post_attention_norm (the FFN's pre-norm despite its
name): router with bias, the top-k of the raw logits, softmax over those k only
(softmax_weight), experts with biases and swiglu_oai (ggml_swiglu_oai: alpha 1.702, limit 7).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..config import swa_layers
from ..errors import GGUFError
from ..gguf_file import GGUFFile
from ..quants import ExpertTensor, QTensor
from . import moe
from .base import Architecture, bind_layer
from .spec import DecoderSpec, LayerSpec

SWA_PATTERN = 2  # layer il slides when il % 2 == 0


def config_from_gguf(f: GGUFFile) -> moe.MoeConfig:
    k = lambda s: f"{f.arch}.{s}"
    for key in (
        "attention.layer_norm_rms_epsilon",
        "expert_feed_forward_length",
        "attention.sliding_window",
    ):
        if not f.has(k(key)):  # llama.cpp's loader requires these for gpt-oss
            raise GGUFError(f"{f.path}: missing metadata key '{k(key)}' (architecture {f.arch})")
    cfg = moe.moe_config(
        f,
        gating="softmax_weight",
        act="swiglu_oai",
        rope_neox=True,
        rope_base_swa=f.get_float(k("rope.freq_base_swa"), 0.0) or 0.0,
        sliding_window=f.get_int(k("attention.sliding_window"), lo=0, hi=1 << 30),
        swa_layers=swa_layers(f, SWA_PATTERN),
    )
    # kq_scale 1/sqrt(n_rot); no dense feed-forward, so its buffers are unused
    return replace(
        cfg, attn_scale=cfg.rope_dim**-0.5, extra_acts=cfg.extra_acts + (("gate", 0), ("up", 0))
    )


@dataclass
class Layer:
    attn_norm: np.ndarray
    attn_q: QTensor
    attn_k: QTensor
    attn_v: QTensor
    attn_q_bias: np.ndarray
    attn_k_bias: np.ndarray
    attn_v_bias: np.ndarray
    attn_output: QTensor
    attn_output_bias: np.ndarray
    attn_sinks: np.ndarray  # (n_head,) one logit per query head
    post_attention_norm: np.ndarray
    ffn_gate_inp: QTensor
    ffn_gate_inp_bias: np.ndarray
    ffn_gate_exps: ExpertTensor
    ffn_up_exps: ExpertTensor
    ffn_down_exps: ExpertTensor
    ffn_gate_exps_bias: np.ndarray  # (n_expert, n_ff_exp)
    ffn_up_exps_bias: np.ndarray
    ffn_down_exps_bias: np.ndarray  # (n_expert, n_embd)


def load_layer(f: GGUFFile, cfg: moe.MoeConfig, il: int) -> Layer:
    return bind_layer(
        f,
        cfg,
        il,
        Layer,
        attn_output_bias=(cfg.n_embd,),
        attn_sinks=(cfg.n_head,),
        **moe.moe_shapes(cfg),
    )


SPEC = DecoderSpec(
    LayerSpec(qkv_bias=True, moe=True, sinks=True, o_bias=True, ffn_norm="post_attention_norm")
)
ARCH = Architecture("gpt-oss", config_from_gguf, load_layer, SPEC)
