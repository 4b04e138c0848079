"""qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B): qwen3's attention (per-head Q/K RMSNorm, NEOX
RoPE) with a mixture-of-experts feed-forward: softmax gating, top-k, the k weights
normalised to sum 1 (llama.cpp src/models/qwen3moe.cpp passes norm_w = true; it reads no
expert_weights_scale for this architecture).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..gguf_file import GGUFFile
from ..quants import ExpertTensor, QTensor
from . import moe
from .base import Architecture, bind_layer
from .spec import DecoderSpec, LayerSpec


def config_from_gguf(f: GGUFFile) -> moe.MoeConfig:
    cfg = moe.moe_config(f, gating="softmax", norm_weights=True, rope_neox=True)
    # no dense feed-forward: its buffers are unused
    return replace(cfg, extra_acts=cfg.extra_acts + (("gate", 0), ("up", 0)))


@dataclass
class Layer:
    attn_norm: np.ndarray
    attn_q: QTensor
    attn_k: QTensor
    attn_v: QTensor
    attn_q_norm: np.ndarray
    attn_k_norm: np.ndarray
    attn_output: QTensor
    ffn_norm: np.ndarray
    ffn_gate_inp: QTensor
    ffn_gate_exps: ExpertTensor
    ffn_up_exps: ExpertTensor
    ffn_down_exps: ExpertTensor


def load_layer(f: GGUFFile, cfg: moe.MoeConfig, il: int) -> Layer:
    return bind_layer(f, cfg, il, Layer, **moe.moe_shapes(cfg))


ARCH = Architecture(
    "qwen3moe", config_from_gguf, load_layer, DecoderSpec(LayerSpec(qk_norm="head", moe=True))
)
