"""Mixture-of-experts feed-forward (llama.cpp's build_moe_ffn), shared by every MoE architecture.

API (stable; extend it, do not change it):

    MoeSpec                 per-model constants: n_expert, n_expert_used, n_ff_exp, gating
                            ("softmax" | "sigmoid" | "softmax_weight"), norm_weights,
                            weights_scale, act (a key of ACTIVATIONS), n_ff_shexp
    MoeConfig(ModelConfig)  a model config with a `moe: MoeSpec` field
    moe_config(f, ...)      MoeConfig from the GGUF: expert_count, expert_used_count,
                            expert_feed_forward_length, checked; adds the MoE activations
    moe_shapes(cfg)         expected shapes of the MoE layer tensors, for bind_layer(**shapes)
    MoeWeights              one layer's router and experts (ExpertTensor, engine/quants/base.py)
                            plus optional biases
    layer_weights(lw)       (MoeWeights, SharedExpert | None) of a layer, by its field names
    SharedExpert            an always-on dense expert, optionally gated by sigmoid(h . gate_inp)
    ffn(s, h, w, spec, shared=None, logits=None) -> s.o   the layer's MoE output for the ubatch
    route(logits, spec, ...) -> (experts, weights)   gating, top-k, weight normalisation
    top_k(p, k)             ggml_argsort_top_k: indices of the k largest per row, llama.cpp's ties
    run_experts(s, h, w, spec, experts, weights, out)   out += the weighted experts' outputs
    shared_ffn(s, h, shared) -> s.o                     the shared expert alone
    warm_up()               compile the routing kernels (kernels_warmup calls it for MoE models)
    ACTIVATIONS             act name -> fn(gate, up, out): out = act(gate, up); add entries
                            for new activations (gpt-oss's "swiglu_oai")

How the experts run: the router gives each token its k experts and their weights. Tokens are
grouped by expert and each expert that any token chose runs once, on its tokens only, through
quants.matmul on that expert's row view (ExpertTensor.expert(e)): quantised mat-vecs for a
few tokens (decode), dequantised tiles + BLAS for many (prefill). Experts nobody chose are
never read, so their pages of the mapped file stay on disk.

Layer tensors (GGUF names, ggml shapes): ffn_gate_inp (n_embd, n_expert) [+ .bias (n_expert,)],
ffn_gate_exps / ffn_up_exps (n_embd, n_ff_exp, n_expert), ffn_down_exps (n_ff_exp, n_embd,
n_expert) [+ .bias (n_ff_exp | n_embd, n_expert)], exp_probs_b.bias (n_expert,) (a bias on
the selection only), shared expert ffn_{gate,up,down}_shexp [+ ffn_gate_inp_shexp (n_embd,)].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import ops
from ..config import ModelConfig, base_config
from ..errors import GGUFError
from ..gguf_file import GGUFFile
from ..quants import ExpertTensor, QTensor, matmul, matmul_many
from ..sampling.std_sort import (
    std_sort,
)  # libstdc++'s std::sort, step for step: ggml_argsort's ties
from . import layers as L

GATINGS = ("softmax", "sigmoid", "softmax_weight")
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
# llama.cpp clamps the sum of the selected weights to the smallest normal f16 before dividing
_NORM_MIN_SUM = np.float32(6.103515625e-5)


def _silu(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    ops.gated_act("silu", g, u, out)


def _gelu(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    ops.gated_act("gelu", g, u, out)


def _swiglu_oai(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    ops.swiglu_oai(g, u, out)  # gpt-oss: clamped gate and up, alpha 1.702, up + 1


# act(gate, up) of one expert's tokens: gate, up, out (n, n_ff_exp) float32, out may be gate
ACTIVATIONS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], None]] = {
    "silu": _silu,
    "gelu": _gelu,
    "swiglu_oai": _swiglu_oai,
}


@dataclass(frozen=True)
class MoeSpec:
    """How a model's MoE layers route and combine (build_moe_ffn's arguments)."""

    n_expert: int = 0
    n_expert_used: int = 0  # k: experts per token
    n_ff_exp: int = 0  # width of one expert's feed-forward
    gating: str = "softmax"  # softmax | sigmoid | softmax_weight (softmax over the top-k logits)
    norm_weights: bool = False  # divide the k weights by their sum
    weights_scale: float = 0.0  # multiply the weights (0 and 1: unchanged)
    act: str = "silu"  # key of ACTIVATIONS
    n_ff_shexp: int = 0  # width of the shared expert (0: none)


@dataclass(frozen=True)
class MoeConfig(ModelConfig):
    moe: MoeSpec = field(default_factory=MoeSpec)


@dataclass(frozen=True)
class MoeWeights:
    """One layer's router and experts. Biases are float32: router_bias and probs_bias
    (n_expert,), the expert biases (n_expert, width of that projection)."""

    router: QTensor  # ffn_gate_inp: n_embd -> n_expert logits
    gate: ExpertTensor | None  # ffn_gate_exps (None: act on up alone is not supported yet)
    up: ExpertTensor  # ffn_up_exps
    down: ExpertTensor  # ffn_down_exps
    router_bias: np.ndarray | None = None  # ffn_gate_inp.bias: added to the logits
    probs_bias: np.ndarray | None = None  # exp_probs_b: added for selection only
    gate_bias: np.ndarray | None = None
    up_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None


@dataclass(frozen=True)
class SharedExpert:
    """A dense SwiGLU expert every token goes through (qwen2moe), its output times
    sigmoid(h . gate_inp) when gate_inp (ffn_gate_inp_shexp, (n_embd,)) is given."""

    gate: QTensor
    up: QTensor
    down: QTensor
    gate_inp: np.ndarray | None = None


def moe_config(
    f: GGUFFile,
    cls: type[MoeConfig] = MoeConfig,
    *,
    gating: str = "softmax",
    norm_weights: bool = False,
    weights_scale: float = 0.0,
    act: str = "silu",
    n_ff_shexp: int = 0,
    **overrides: Any,
) -> MoeConfig:
    """base_config plus the expert hyper-parameters, checked as llama.cpp's loader does.

    The ubatch buffers gain "moe_gate"/"moe_up" (n_ff_exp wide), "moe_out" (n_embd) and
    "router" (n_expert), so buffers.buffer_shapes and the estimate count them.
    """
    cfg = base_config(f, cls, **overrides)
    k = lambda s: f"{f.arch}.{s}"
    n_expert = f.get_int(k("expert_count"), 0, lo=0, hi=MAX_EXPERTS)
    n_used = f.get_int(k("expert_used_count"), 0, lo=0, hi=MAX_EXPERTS)
    if n_expert == 0:
        raise GGUFError(
            f"{f.path}: {k('expert_count')} is missing or 0; a {f.arch} model needs experts"
        )
    if n_used == 0:
        raise GGUFError(
            f"{f.path}: {k('expert_used_count')} is missing or 0; a {f.arch} model needs it"
        )
    if n_used > n_expert:
        raise GGUFError(
            f"{f.path}: {k('expert_used_count')} = {n_used} is more than "
            f"{k('expert_count')} = {n_expert}"
        )
    n_ff_exp = f.get_int(k("expert_feed_forward_length"), 0, lo=0, hi=1 << 24) or cfg.n_ff // n_used
    if n_ff_exp <= 0:
        raise GGUFError(f"{f.path}: invalid expert feed-forward length {n_ff_exp}")
    if gating not in GATINGS or act not in ACTIVATIONS:
        raise ValueError(f"unknown MoE gating {gating!r} or activation {act!r}")
    spec = MoeSpec(n_expert, n_used, n_ff_exp, gating, norm_weights, weights_scale, act, n_ff_shexp)
    acts = (
        ("moe_gate", n_ff_exp),
        ("moe_up", n_ff_exp),
        ("moe_out", cfg.n_embd),
        ("router", n_expert),
    )
    return replace(cfg, moe=spec, extra_acts=cfg.extra_acts + acts)


def moe_shapes(cfg: MoeConfig) -> dict[str, tuple[int, ...]]:
    """Expected ggml shapes of the MoE layer tensors by layer-dataclass field name."""
    E, X, F, Fs = cfg.n_embd, cfg.moe.n_expert, cfg.moe.n_ff_exp, cfg.moe.n_ff_shexp or cfg.n_ff
    return dict(
        ffn_gate_inp=(E, X),
        ffn_gate_inp_bias=(X,),
        exp_probs_b_bias=(X,),
        ffn_gate_exps=(E, F, X),
        ffn_up_exps=(E, F, X),
        ffn_down_exps=(F, E, X),
        ffn_gate_exps_bias=(F, X),
        ffn_up_exps_bias=(F, X),
        ffn_down_exps_bias=(E, X),
        ffn_gate_inp_shexp=(E,),
        ffn_gate_shexp=(E, Fs),
        ffn_up_shexp=(E, Fs),
        ffn_down_shexp=(Fs, E),
    )


# --- routing -----------------------------------------------------------------------------------


def top_k(p: np.ndarray, k: int) -> np.ndarray:
    """(T, k) int64 indices of the k largest of each row of p (T, n) float32, in the order
    ggml_argsort_top_k gives them (ties as libstdc++'s std::sort leaves them)."""
    p = np.ascontiguousarray(p, np.float32)
    n = p.shape[1]
    # Without ties among the k+1 largest every sort agrees: one vectorised argsort. Rows
    # with such ties replay std::sort, one call per row (a numba kernel calling std_sort,
    # recursive and another module's, crashed when loaded from numba's cache).
    order = np.argsort(-p, axis=1, kind="stable")[:, : min(k + 1, n)]
    top = p[np.arange(p.shape[0])[:, None], order]  # (take_along_axis: twice the time per call)
    out = order[:, :k].astype(np.int64)
    for t in np.flatnonzero((top[:, 1:] == top[:, :-1]).any(axis=1)):
        h = np.arange(n)
        std_sort(p[t], h, 0, n)
        out[t] = h[:k]
    return out


def _softmax_rows(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max over each row, float32 (the sum in float64, as ggml_float)."""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, dtype=np.float64, keepdims=True)).astype(np.float32)


def route(
    logits: np.ndarray,
    spec: MoeSpec,
    router_bias: np.ndarray | None = None,
    probs_bias: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The experts of each token and their weights, as build_moe_ffn computes them.

    Args:
        logits: (T, n_expert) float32 router outputs (ffn_gate_inp h).
        spec: gating, k, normalisation and scale.
        router_bias: added to the logits first (gpt-oss).
        probs_bias: added to the gating probabilities for choosing only (DeepSeek V3).
    Returns:
        experts (T, k) int64 in ggml's top-k order, weights (T, k) float32.
    """
    logits = logits.astype(np.float32, copy=True)
    if router_bias is not None:
        logits += router_bias
    if spec.gating == "softmax":
        probs = _softmax_rows(logits)
    elif spec.gating == "sigmoid":
        probs = (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    elif spec.gating == "softmax_weight":
        probs = logits
    else:
        raise ValueError(f"unknown MoE gating {spec.gating!r}")
    select = probs + probs_bias if probs_bias is not None else probs
    experts = top_k(select, spec.n_expert_used)
    weights = probs[np.arange(probs.shape[0])[:, None], experts]
    if spec.gating == "softmax_weight":
        weights = _softmax_rows(weights)
    if spec.norm_weights:
        weights = weights / np.maximum(weights.sum(axis=1, keepdims=True), _NORM_MIN_SUM)
    if spec.weights_scale not in (0.0, 1.0):
        weights = weights * np.float32(spec.weights_scale)
    return experts, weights.astype(np.float32, copy=False)


# --- the feed-forward --------------------------------------------------------------------------


def layer_weights(lw) -> tuple[MoeWeights, SharedExpert | None]:
    """A MoE layer's router and experts, and its shared expert (None without), from the
    layer's fields as moe_shapes names them; optional ones a layer lacks are None."""

    def opt(name: str):
        return getattr(lw, name, None)

    w = MoeWeights(
        lw.ffn_gate_inp,
        lw.ffn_gate_exps,
        lw.ffn_up_exps,
        lw.ffn_down_exps,
        router_bias=opt("ffn_gate_inp_bias"),
        probs_bias=opt("exp_probs_b_bias"),
        gate_bias=opt("ffn_gate_exps_bias"),
        up_bias=opt("ffn_up_exps_bias"),
        down_bias=opt("ffn_down_exps_bias"),
    )
    if opt("ffn_gate_shexp") is None:
        return w, None
    return w, SharedExpert(
        lw.ffn_gate_shexp, lw.ffn_up_shexp, lw.ffn_down_shexp, opt("ffn_gate_inp_shexp")
    )


def ffn(
    s: L.UbatchState,
    h: np.ndarray,
    w: MoeWeights,
    spec: MoeSpec,
    shared: SharedExpert | None = None,
    logits: np.ndarray | None = None,
) -> np.ndarray:
    """The MoE feed-forward of h (T, n_embd) into s.o (returned): the shared expert if any,
    plus the sum over each token's k experts of weight * down(act(gate h, up h)). logits: the
    router's output for h when the caller has it (a compiled decode step), else computed."""
    T = s.n_tokens
    if shared is not None:
        shared_ffn(s, h, shared)
    else:
        s.o[:] = 0.0
    if logits is None:
        logits = s.buf.router[:T]
        matmul(w.router, h, logits, s.tile, s.path)
    experts, weights = route(logits, spec, w.router_bias, w.probs_bias)
    run_experts(s, h, w, spec, experts, weights, s.o)
    return s.o


def shared_ffn(s: L.UbatchState, h: np.ndarray, sh: SharedExpert) -> np.ndarray:
    """s.o = the shared expert's output (uses s.gate/s.up: the config's n_ff is its width)."""
    out = L.ffn(s, h, sh.gate, sh.up, sh.down, "silu")
    if sh.gate_inp is not None:
        g = h @ sh.gate_inp  # (T,)
        out *= (1.0 / (1.0 + np.exp(-g)))[:, None].astype(np.float32)
    return out


def run_experts(
    s: L.UbatchState,
    h: np.ndarray,
    w: MoeWeights,
    spec: MoeSpec,
    experts: np.ndarray,
    weights: np.ndarray,
    out: np.ndarray,
) -> None:
    """out[t] += sum_j weights[t, j] * expert experts[t, j] (h[t]); each chosen expert runs
    once on the tokens that chose it, reading only its own rows."""
    if w.gate is None:
        raise NotImplementedError("MoE experts without a gate projection")
    act = ACTIVATIONS[spec.act]
    T = h.shape[0]
    for e in np.unique(experts):
        tok, slot = np.nonzero(experts == e)  # a token picks an expert at most once
        n = len(tok)
        hs = h if n == T else np.ascontiguousarray(h[tok])
        g, u, y = s.buf.moe_gate[:n], s.buf.moe_up[:n], s.buf.moe_out[:n]
        matmul_many([w.gate.expert(e), w.up.expert(e)], hs, [g, u], s.tile, s.path)
        if w.gate_bias is not None:
            g += w.gate_bias[e]
        if w.up_bias is not None:
            u += w.up_bias[e]
        act(g, u, g)
        matmul(w.down.expert(e), g, y, s.tile, s.path)
        if w.down_bias is not None:
            y += w.down_bias[e]
        y *= weights[tok, slot][:, None]
        out[tok] += y


def warm_up() -> None:
    """Compile (or load) the routing kernel."""
    top_k(np.zeros((1, 4), np.float32), 2)
