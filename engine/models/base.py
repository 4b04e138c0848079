"""What an architecture is (`Architecture`, the record each engine/models/<arch>.py
declares as ARCH: how to read it from a GGUF and its `DecoderSpec`), the model-level weights
every architecture has, and `bind_layer`, which fills an architecture's per-layer dataclass
from the GGUF by field name.

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
from . import decoder, layers
from .spec import DecoderSpec


@dataclass(frozen=True)
class Architecture:
    """One architecture: its hyper-parameters, its per-layer tensors and its computation.

    config_from_gguf(f) -> ModelConfig (or the architecture's subclass of it)
    load_layer(f, cfg, il) -> its layer dataclass, attributes named as GGUF tensors
    spec: what it computes (models/spec.py); the Python block, embedding and head below, the
        compiled decode step and the GL plan are all derived from it
    """

    name: str
    config_from_gguf: Callable[[GGUFFile], ModelConfig]
    load_layer: Callable[[GGUFFile, Any, int], Any]
    spec: DecoderSpec = DecoderSpec()

    def block(self, s: layers.UbatchState, il: int, lw: Any) -> None:
        """Layer il on a ubatch, s.x updated in place."""
        decoder.block(self.spec.layer, s, il, lw)

    def embed(self, s: layers.UbatchState, w: ModelWeights) -> None:
        """The ubatch's token embeddings into s.x."""
        decoder.embed(self.spec, s, w)

    def head(
        self, s: layers.UbatchState, w: ModelWeights, out: np.ndarray, embeddings: bool
    ) -> None:
        """Final norm and logits (or embeddings) of the ubatch's output rows into out."""
        decoder.head(self.spec, s, w, out, embeddings)


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
        attn_norm=(E,),
        attn_q=(E, q),
        attn_k=(E, kv),
        attn_v=(E, v),
        attn_qkv=(E, q + kv + v),
        attn_q_bias=(q,),
        attn_k_bias=(kv,),
        attn_v_bias=(v,),
        attn_q_norm=(D,),
        attn_k_norm=(D,),
        attn_output=(cfg.n_head * cfg.head_dim_v, E),
        post_attention_norm=(E,),
        ffn_norm=(E,),
        ffn_gate=(E, F),
        ffn_up=(E, F),
        ffn_down=(F, E),
        post_ffw_norm=(E,),
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
            values[fld.name] = (
                f.vector(name, shape[0]) if len(shape) == 1 else f.qtensor(name, shape)
            )
    return cls(**values)


def rope_factors(f: GGUFFile, cfg: ModelConfig, name: str) -> tuple[float, ...]:
    """A model-level tensor of per-pair RoPE frequency divisors (rope_dim / 2 values), or ()
    when the file has none: rope_freqs (Llama 3.1+), rope_factors_long/short (LongRoPE)."""
    return tuple(f.vector(name, cfg.rope_dim // 2).tolist()) if name in f.tensors else ()


def qtensors(lw) -> list[QTensor]:
    """The matrices of one layer dataclass (for kernel warm-up); of a stack of experts only
    the first expert, so that nothing pages in the others."""
    return [
        v.expert(0) if isinstance(v, ExpertTensor) else v
        for v in vars(lw).values()
        if isinstance(v, (QTensor, ExpertTensor))
    ]
