"""What an architecture is (`Architecture`, the record each engine/models/<arch>.py
declares as ARCH), the model-level weights every architecture has, and `bind_layer`, which
fills an architecture's per-layer dataclass from the GGUF by field name.

A layer dataclass's attributes are GGUF tensor names: field `attn_q` of layer 3 is
`blk.3.attn_q.weight`, field `attn_q_bias` is `blk.3.attn_q.bias`. Every field is required;
its expected shape comes from `layer_shapes(cfg)` unless the architecture overrides it. A
3-D shape binds an ExpertTensor (MoE experts), a 2-D bias a float32 (n_expert, n) array.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import MissingTensorError
from ..gguf_file import GGUFFile
from ..quants import ExpertTensor, QTensor
from . import layers
from .step import StepSpec


@dataclass(frozen=True)
class Architecture:
    """One architecture: its hyper-parameters, its per-layer tensors and its computation.

    config_from_gguf(f) -> ModelConfig (or the architecture's subclass of it)
    load_layer(f, cfg, il) -> its layer dataclass, attributes named as GGUF tensors
    block(s, il, lw): one layer on a ubatch, s.x updated in place
    embed(s, w) and head(s, w, out, embeddings): token embeddings into s.x, final norm and
        logits of the output rows; the shared ones of layers.py unless the architecture differs
    step: when block is the standard decoder layer, which variant of it (decode then runs
        each layer of a one-token ubatch as one compiled call with the same results)
    """

    name: str
    config_from_gguf: Callable[[GGUFFile], ModelConfig]
    load_layer: Callable[[GGUFFile, Any, int], Any]
    block: Callable[[layers.UbatchState, int, Any], None]
    embed: Callable[[layers.UbatchState, Any], None] = layers.embed
    head: Callable[[layers.UbatchState, Any, np.ndarray, bool], None] = layers.head
    step: StepSpec | None = None  # block as a compiled single-token step (models/step.py)


@dataclass
class ModelWeights:
    token_embd: QTensor
    output_norm: np.ndarray
    output: QTensor  # token_embd itself when the embeddings are tied
    layers: list  # one dataclass of the architecture per layer


def load_weights(f: GGUFFile, cfg: ModelConfig, load_layer) -> ModelWeights:
    """Bind every tensor as a zero-copy view, checking shapes; `load_layer(f, cfg, il)` binds
    one layer's tensors."""
    E, V = cfg.n_embd, cfg.n_vocab
    token_embd = f.qtensor("token_embd.weight", (E, V))
    output = f.qtensor("output.weight", (E, V)) if "output.weight" in f.tensors else token_embd
    layers = [load_layer(f, cfg, il) for il in range(cfg.n_layer)]
    return ModelWeights(token_embd, f.vector("output_norm.weight", E), output, layers)


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Expected shape of each usual layer tensor, in ggml order: (n_cols, n_rows) for
    matrices, (n,) for vectors (norm weights, biases)."""
    E, F, D = cfg.n_embd, cfg.n_ff, cfg.head_dim
    q, kv, v = cfg.n_head * D, cfg.n_head_kv * D, cfg.n_head_kv * cfg.head_dim_v
    return dict(
        attn_norm=(E,), attn_q=(E, q), attn_k=(E, kv), attn_v=(E, v), attn_qkv=(E, q + kv + v),
        attn_q_bias=(q,), attn_k_bias=(kv,), attn_v_bias=(v,), attn_q_norm=(D,), attn_k_norm=(D,),
        attn_output=(cfg.n_head * cfg.head_dim_v, E), post_attention_norm=(E,),
        ffn_norm=(E,), ffn_gate=(E, F), ffn_up=(E, F), ffn_down=(F, E), post_ffw_norm=(E,),
    )


def bind_layer(f: GGUFFile, cfg: ModelConfig, il: int, cls, **shapes):
    """An instance of the layer dataclass `cls` for layer il: each field bound to its tensor
    (a QTensor for matrices, a float32 vector otherwise); `shapes` overrides expected shapes."""
    expected = layer_shapes(cfg) | shapes
    values: dict[str, Any] = {}
    for fld in fields(cls):
        base, kind = (fld.name[:-5], "bias") if fld.name.endswith("_bias") else (fld.name, "weight")
        name, shape = f"blk.{il}.{base}.{kind}", expected[fld.name]
        if name not in f.tensors:
            raise MissingTensorError(f"{f.path}: missing tensor '{name}' (architecture {cfg.arch})")
        if len(shape) == 3:  # MoE experts stacked (ffn_*_exps)
            values[fld.name] = f.expert_tensor(name, (shape[0], shape[1], shape[2]))
        elif len(shape) == 2 and kind == "bias":  # per-expert biases: (n_expert, n) float32
            values[fld.name] = f.rows_f32(name, (shape[0], shape[1]))
        else:
            values[fld.name] = f.vector(name, shape[0]) if len(shape) == 1 else f.qtensor(name, shape)
    return cls(**values)


def rope_factors(f: GGUFFile, cfg: ModelConfig, name: str) -> tuple[float, ...]:
    """A model-level tensor of per-pair RoPE frequency divisors (rope_dim / 2 values), or ()
    when the file has none: rope_freqs (Llama 3.1+), rope_factors_long/short (LongRoPE)."""
    return tuple(f.vector(name, cfg.rope_dim // 2).tolist()) if name in f.tensors else ()


def qtensors(lw) -> list[QTensor]:
    """The matrices of one layer dataclass (for kernel warm-up); of a stack of experts only
    the first expert, so that nothing pages in the others."""
    return [v.expert(0) if isinstance(v, ExpertTensor) else v for v in vars(lw).values()
            if isinstance(v, (QTensor, ExpertTensor))]
