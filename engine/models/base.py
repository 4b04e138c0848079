"""Shared building blocks of decoder-only transformers: the weight set every architecture loads.

Weight attributes carry GGUF tensor names. Architectures differ only in their ModelConfig
flags (engine/config.py), which decide the optional tensors loaded here and the optional
steps taken by the shared forward pass (engine/forward.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from ..quants import QTensor


@dataclass
class LayerWeights:
    attn_norm: np.ndarray
    attn_q: QTensor
    attn_k: QTensor
    attn_v: QTensor
    attn_output: QTensor
    ffn_norm: np.ndarray
    ffn_gate: QTensor
    ffn_up: QTensor
    ffn_down: QTensor
    attn_q_bias: np.ndarray | None = None
    attn_k_bias: np.ndarray | None = None
    attn_v_bias: np.ndarray | None = None
    attn_q_norm: np.ndarray | None = None
    attn_k_norm: np.ndarray | None = None
    post_attention_norm: np.ndarray | None = None
    post_ffw_norm: np.ndarray | None = None


@dataclass
class ModelWeights:
    token_embd: QTensor
    output_norm: np.ndarray
    output: QTensor  # token_embd itself when the embeddings are tied
    layers: list[LayerWeights]


def load_weights(f: GGUFFile, cfg: ModelConfig) -> ModelWeights:
    """Bind every tensor the config needs as a zero-copy view, checking shapes."""
    E, V = cfg.n_embd, cfg.n_vocab
    q_dim, kv_dim, v_dim = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.head_dim_v
    token_embd = f.qtensor("token_embd.weight", (E, V))
    output = f.qtensor("output.weight", (E, V)) if "output.weight" in f.tensors else token_embd
    layers = []
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        lw = LayerWeights(
            attn_norm=f.vector(p + "attn_norm.weight", E),
            attn_q=f.qtensor(p + "attn_q.weight", (E, q_dim)),
            attn_k=f.qtensor(p + "attn_k.weight", (E, kv_dim)),
            attn_v=f.qtensor(p + "attn_v.weight", (E, v_dim)),
            attn_output=f.qtensor(p + "attn_output.weight", (cfg.n_head * cfg.head_dim_v, E)),
            ffn_norm=f.vector(p + "ffn_norm.weight", E),
            ffn_gate=f.qtensor(p + "ffn_gate.weight", (E, cfg.n_ff)),
            ffn_up=f.qtensor(p + "ffn_up.weight", (E, cfg.n_ff)),
            ffn_down=f.qtensor(p + "ffn_down.weight", (cfg.n_ff, E)),
        )
        if cfg.qkv_bias:
            lw.attn_q_bias = f.vector(p + "attn_q.bias", q_dim)
            lw.attn_k_bias = f.vector(p + "attn_k.bias", kv_dim)
            lw.attn_v_bias = f.vector(p + "attn_v.bias", v_dim)
        if cfg.qk_norm:
            lw.attn_q_norm = f.vector(p + "attn_q_norm.weight", cfg.head_dim)
            lw.attn_k_norm = f.vector(p + "attn_k_norm.weight", cfg.head_dim)
        if cfg.post_norms:
            lw.post_attention_norm = f.vector(p + "post_attention_norm.weight", E)
            lw.post_ffw_norm = f.vector(p + "post_ffw_norm.weight", E)
        layers.append(lw)
    return ModelWeights(token_embd, f.vector("output_norm.weight", E), output, layers)
