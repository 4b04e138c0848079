"""qwen2moe (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): qwen2's attention (Q/K/V biases, optional as
in llama.cpp; NEOX RoPE), then a mixture of experts with softmax gating and the raw top-k
weights (llama.cpp src/models/qwen2moe.cpp passes norm_w = false), plus a shared expert of
width expert_shared_feed_forward_length scaled by sigmoid(h . ffn_gate_inp_shexp).
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
    n_ff = f.get_int(f"{f.arch}.feed_forward_length")
    n_ff_shexp = (
        f.get_int(f"{f.arch}.expert_shared_feed_forward_length", 0, lo=0, hi=1 << 24) or n_ff
    )
    cfg = moe.moe_config(
        f, gating="softmax", norm_weights=False, n_ff_shexp=n_ff_shexp, rope_neox=True
    )
    # the shared expert runs through the dense feed-forward's buffers
    return replace(cfg, extra_acts=cfg.extra_acts + (("gate", n_ff_shexp), ("up", n_ff_shexp)))


@dataclass
class Layer:
    attn_norm: np.ndarray
    attn_q: QTensor
    attn_k: QTensor
    attn_v: QTensor
    attn_output: QTensor
    ffn_norm: np.ndarray
    ffn_gate_inp: QTensor
    ffn_gate_exps: ExpertTensor
    ffn_up_exps: ExpertTensor
    ffn_down_exps: ExpertTensor
    ffn_gate_inp_shexp: np.ndarray
    ffn_gate_shexp: QTensor
    ffn_up_shexp: QTensor
    ffn_down_shexp: QTensor


@dataclass
class BiasedLayer(Layer):
    """With biases on the Q, K and V projections (Qwen1.5-MoE and Qwen2-MoE have them)."""

    attn_q_bias: np.ndarray
    attn_k_bias: np.ndarray
    attn_v_bias: np.ndarray


def load_layer(f: GGUFFile, cfg: moe.MoeConfig, il: int) -> Layer:
    cls = BiasedLayer if f"blk.{il}.attn_q.bias" in f.tensors else Layer
    return bind_layer(f, cfg, il, cls, **moe.moe_shapes(cfg))


# qkv_bias: where the layer has them (a BiasedLayer); the shared expert: moe.layer_weights
ARCH = Architecture(
    "qwen2moe", config_from_gguf, load_layer, DecoderSpec(LayerSpec(qkv_bias=True, moe=True))
)
