"""The declarative description of a decoder architecture: `LayerSpec` (its layer) and
`DecoderSpec` (the layer plus how the tokens go in and the logits come out).

Each engine/models/<arch>.py declares one `DecoderSpec`; everything that runs the model is
derived from it (llama.cpp's one graph per architecture, which every backend executes):

- the Python block, embedding and head (models/decoder.py), the reference every other
  path is tested against;
- the compiled one-token decode step (models/step.py);
- the OpenGL offload plan (backends/gl/offload.py `gl_plan`), for the descriptions it runs.

This module imports nothing of the engine, so that every one of them can import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# what each model-level variant multiplies the token embeddings by (DecoderSpec.embed_scale)
EMBED_SCALES = ("", "sqrt_n_embd", "embedding_scale")


@dataclass(frozen=True)
class LayerSpec:
    """The standard decoder layer, with the variations the architectures have:

    x += attn(norm(x)) [post-norm'd], x += ffn(norm(x)) [post-norm'd], with
    qkv_bias: Q/K/V biases (attn_q_bias...; qwen2); qk_norm: RMSNorm of Q and K, "head" per
    head (attn_q_norm, attn_k_norm; qwen3, gemma3) or "whole" over each whole projection
    (olmo2); pre_norms: False when the sublayers read x unnormalised (olmo2, which has only
    post-norms); post_norms: post_attention_norm and post_ffw_norm on each branch's output
    (gemma2/3, olmo2); act: "silu" or "gelu"; attn_softcap: scores capped by
    cfg.attn_logit_softcap (gemma2); fused: one Q|K|V weight (attn_qkv) and one gate|up weight
    (ffn_up) with SwiGLU (phi3); residual_scale: each branch's output times
    cfg.residual_scale before its add, when that is set (granite); moe: the feed-forward is a
    mixture of experts (qwen3moe, qwen2moe, gpt-oss; moe.ffn) with the expert biases,
    activation and shared expert the layer and cfg.moe have; qkv_bias then means "where the
    layer has them" (qwen2moe's are optional); sinks: attention sinks (attn_sinks; gpt-oss);
    o_bias: the output projection's bias (attn_output_bias; gpt-oss); ffn_norm: the layer's
    norm before the feed-forward (gpt-oss calls it post_attention_norm).

    The semantics of each flag are written once, in models/decoder.py `block`; the compiled
    step and the GL plan must (and tests check they do) compute the same.
    """

    qkv_bias: bool = False
    qk_norm: str = ""
    pre_norms: bool = True
    post_norms: bool = False
    act: str = "silu"
    attn_softcap: bool = False
    fused: bool = False
    residual_scale: bool = False
    moe: bool = False
    sinks: bool = False
    o_bias: bool = False
    ffn_norm: str = "ffn_norm"

    def __post_init__(self) -> None:
        if self.qk_norm not in ("", "head", "whole") or self.act not in ("silu", "gelu"):
            raise ValueError(f"unknown layer variant {self}")
        if self.fused and (self.act != "silu" or self.qkv_bias or self.qk_norm or self.post_norms):
            raise ValueError(f"fused projections come with plain SwiGLU only: {self}")
        if self.moe and (
            self.fused or self.post_norms or self.residual_scale or self.act != "silu"
        ):
            raise ValueError(
                f"MoE layers have pre-norms and the experts' own activation only: {self}"
            )

    @property
    def aux(self) -> tuple[str, ...]:
        """The layer's vectors beside its weights and pre-norms, in the compiled step's `aux`
        order."""
        names: tuple[str, ...] = ()
        if self.qkv_bias:
            names += ("attn_q_bias", "attn_k_bias", "attn_v_bias")
        if self.qk_norm:
            names += ("attn_q_norm", "attn_k_norm")
        if self.post_norms:
            names += ("post_attention_norm", "post_ffw_norm")
        if self.o_bias:
            names += ("attn_output_bias",)
        return names

    @property
    def weights(self) -> tuple[str, ...]:
        """The layer's weight names, in the step's wq, wk, wv, wo, wg, wu, wd order (a fused
        weight fills the places of the ones it joins)."""
        if self.fused:
            return (
                "attn_qkv",
                "attn_qkv",
                "attn_qkv",
                "attn_output",
                "ffn_up",
                "ffn_up",
                "ffn_down",
            )
        if self.moe:  # the router in the feed-forward's places; the experts go to experts_step
            return (
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_gate_inp",
                "ffn_gate_inp",
                "ffn_gate_inp",
            )
        return ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")

    @property
    def tensors(self) -> tuple[str, ...]:
        """Every tensor the description reads from a layer (its dataclass must have them; of
        optional ones, qwen2moe's Q/K/V biases, none)."""
        norms = ("attn_norm", self.ffn_norm) if self.pre_norms else ()
        experts = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps") if self.moe else ()
        sinks = ("attn_sinks",) if self.sinks else ()
        aux = tuple(
            n for n in self.aux if not (self.moe and n.endswith(("q_bias", "k_bias", "v_bias")))
        )
        return tuple(dict.fromkeys(norms + self.weights + aux + sinks + experts))


@dataclass(frozen=True)
class DecoderSpec:
    """An architecture's computation: embeddings, n_layer times `layer`, final norm, logits.

    embed_scale: the token embeddings times "sqrt_n_embd" (gemma2/3) or cfg.embedding_scale
    when set ("embedding_scale": granite), "" for none; final_softcap: the logits capped to
    c * tanh(logit / c) with c = cfg.final_logit_softcap when set (gemma2/3); logit_scale: the
    logits (not the embeddings a context returns) divided by cfg.logit_scale (granite).
    """

    layer: LayerSpec = field(default_factory=LayerSpec)
    embed_scale: str = ""
    final_softcap: bool = False
    logit_scale: bool = False

    def __post_init__(self) -> None:
        if self.embed_scale not in EMBED_SCALES:
            raise ValueError(
                f"unknown embedding scale {self.embed_scale!r} (one of {EMBED_SCALES})"
            )
