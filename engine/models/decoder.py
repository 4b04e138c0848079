"""The reference computation of a `DecoderSpec` (models/spec.py): one layer (`block`), the
token embeddings (`embed`) and the head (`head`), built from the pieces of models/layers.py.

This is the Python form every architecture runs for prompt chunks and every layer no faster
path serves, and the oracle of those paths: the compiled decode step (models/step.py) gives
its logits bit for bit, the GL offload its logits within rounding. The order of the calls is
part of the result (float sums), so a new variant adds a branch here rather than reordering.
"""

from __future__ import annotations

import math

import numpy as np

from . import layers as L
from . import moe
from .spec import DecoderSpec, LayerSpec


def block(spec: LayerSpec, s: L.UbatchState, il: int, lw) -> None:
    """Layer il of the ubatch s as spec describes it, with the layer's tensors lw (the
    architecture's layer dataclass); s.x updated in place."""
    h = L.norm(s, s.x, lw.attn_norm) if spec.pre_norms else s.x
    if spec.fused:
        q, k, v = L.qkv_fused(s, h, lw.attn_qkv)
    elif spec.qkv_bias and hasattr(lw, "attn_q_bias"):  # optional in qwen2moe's layers
        q, k, v = L.qkv(
            s, h, lw.attn_q, lw.attn_k, lw.attn_v, lw.attn_q_bias, lw.attn_k_bias, lw.attn_v_bias
        )
    else:
        q, k, v = L.qkv(s, h, lw.attn_q, lw.attn_k, lw.attn_v)
    if spec.qk_norm == "head":
        L.norm_heads(s, q, lw.attn_q_norm)
        L.norm_heads(s, k, lw.attn_k_norm)
    elif spec.qk_norm == "whole":  # s.q, s.k: the (T, width) buffers behind q and k
        L.norm(s, s.q, lw.attn_q_norm, s.q)
        L.norm(s, s.k, lw.attn_k_norm, s.k)
    o = L.attention(
        s,
        il,
        q,
        k,
        v,
        lw.attn_output,
        s.cfg.attn_logit_softcap if spec.attn_softcap else 0.0,
        lw.attn_sinks if spec.sinks else None,
        lw.attn_output_bias if spec.o_bias else None,
    )
    # each branch's output joins the residual stream post-normed and scaled (in place) as
    # the spec says; written out twice rather than as a helper: this runs per layer and ubatch
    if spec.post_norms:
        o = L.norm(s, o, lw.post_attention_norm, o)
    if spec.residual_scale and s.cfg.residual_scale:
        o *= np.float32(s.cfg.residual_scale)
    s.x += o
    h = L.norm(s, s.x, getattr(lw, spec.ffn_norm)) if spec.pre_norms else s.x
    if spec.moe:
        experts, shared = moe.layer_weights(lw)
        o = moe.ffn(s, h, experts, s.cfg.moe, shared)
    elif spec.fused:
        o = L.ffn_fused(s, h, lw.ffn_up, lw.ffn_down)
    else:
        o = L.ffn(s, h, lw.ffn_gate, lw.ffn_up, lw.ffn_down, spec.act)
    if spec.post_norms:
        o = L.norm(s, o, lw.post_ffw_norm, o)
    if spec.residual_scale and s.cfg.residual_scale:
        o *= np.float32(s.cfg.residual_scale)
    s.x += o


def embed(spec: DecoderSpec, s: L.UbatchState, w) -> None:
    """s.x = the ubatch's token embeddings, scaled as spec says."""
    if spec.embed_scale == "sqrt_n_embd":
        L.embed(s, w, math.sqrt(s.cfg.n_embd))
    elif spec.embed_scale == "embedding_scale":
        L.embed(s, w, s.cfg.embedding_scale or 1.0)
    else:
        L.embed(s, w)


def head(spec: DecoderSpec, s: L.UbatchState, w, out: np.ndarray, embeddings: bool) -> None:
    """Final norm, then the logits (soft-capped, scaled as spec says) or the embeddings of
    the ubatch's output rows into out."""
    L.head(s, w, out, embeddings, s.cfg.final_logit_softcap if spec.final_softcap else 0.0)
    if spec.logit_scale and not embeddings:  # llama.cpp scales the logits only, not the embeddings
        out /= np.float32(s.cfg.logit_scale)
