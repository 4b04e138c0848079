"""The compiled layer step: one numba call per layer for decode ubatches (1..8 tokens).

A decode step of one token is ~12 small operations a layer (norms, fused mat-vecs, RoPE, the
KV store, attention, residual adds). Run from Python, each pays for its glue and its numba
dispatch: on SmolLM2 (30 layers) about 2 ms of a 10 ms token. An architecture whose block is
the standard pre-norm decoder layer declares a `StepSpec`; for it this module writes, per
combination of weight types, KV cache types and decode path, a small module whose one njit
function calls the *same* kernels in the *same* order as the Python block (so the logits are
bit for bit those of `block`; tests/test_decode_step.py checks every spec), and numba caches
its machine code like any kernel's. Each context gets a one-token step per layer and, when it
has several sequences, one for 2..MATVEC_MAX_TOKENS tokens (slots decoding together), both
compiled (or loaded from the cache) with the context. A mixture-of-experts layer's step ends
with the router's logits: moe.route picks the tokens' experts in Python (its exact ties and
float64 sums stay one piece of code), then a second compiled call runs them for one token,
and moe.ffn, grouped by expert, for several. Layers it cannot serve (a weight type
without a fused kernel, a GPU layer) run the Python block, as do prompt chunks.

Step modules are named by the engine version that wrote them; another version's are deleted
(with numba's cache of them) a week after they were written (prune).

GGSTATION_STEP=0 turns it off, =1 forces it on (tests); by default it serves layers of at
least MIN_LAYER_BYTES of weights: below that (the tiny test models) a first compile of a
type combination costs more than the glue it saves.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numba
import numpy as np
from numba.core.registry import CPUDispatcher

from .. import jit, ops
from ..quants import MATVEC_MAX_TOKENS, QUANT_TYPES, ExpertTensor, QTensor, decode_path, interleaved, path_op
from ..quants._kern import _raw_rows
from . import moe

log = logging.getLogger("ggstation.engine")

MIN_LAYER_BYTES = 1 << 20


@dataclass(frozen=True)
class StepSpec:
    """The standard decoder layer, with the variations the architectures that declare it have:

    x += attn(norm(x)) [post-norm'd], x += ffn(norm(x)) [post-norm'd], with
    qkv_bias: Q/K/V biases (attn_q_bias...; qwen2); qk_norm: RMSNorm of Q and K, "head" per
    head (attn_q_norm, attn_k_norm; qwen3, gemma3) or "whole" over each whole projection
    (olmo2); pre_norms: False when the sublayers read x unnormalised (olmo2, which has only
    post-norms); post_norms: post_attention_norm and post_ffw_norm on each branch's output
    (gemma2/3, olmo2); act: "silu" or "gelu"; attn_softcap: scores capped by
    cfg.attn_logit_softcap (gemma2); fused: one Q|K|V weight (attn_qkv) and one gate|up weight
    (ffn_up) with SwiGLU (phi3); residual_scale: each branch's output times
    cfg.residual_scale before its add (granite); moe: the feed-forward is a mixture of experts
    (qwen3moe, qwen2moe, gpt-oss; moe.ffn): the step ends with the router's logits,
    moe.route picks the experts in Python, and a second compiled call runs them (one token;
    moe.ffn for several), with the expert biases, activation and shared expert the layer and
    cfg.moe have; qkv_bias then means "where the layer has them" (qwen2moe's are optional); sinks:
    attention sinks (attn_sinks; gpt-oss); o_bias: the output projection's bias
    (attn_output_bias; gpt-oss); ffn_norm: the layer's norm before the feed-forward
    (gpt-oss calls it post_attention_norm).
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
            raise ValueError(f"unknown step variant {self}")
        if self.fused and (self.act != "silu" or self.qkv_bias or self.qk_norm or self.post_norms):
            raise ValueError(f"fused projections come with plain SwiGLU only: {self}")
        if self.moe and (self.fused or self.post_norms or self.residual_scale or self.act != "silu"):
            raise ValueError(f"MoE steps have pre-norms and the experts' own activation only: {self}")

    @property
    def aux(self) -> tuple[str, ...]:
        """The layer's arrays the step reads from its `aux` tuple, in that order."""
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
            return ("attn_qkv", "attn_qkv", "attn_qkv", "attn_output", "ffn_up", "ffn_up", "ffn_down")
        if self.moe:  # the router in the feed-forward's places; the experts go to experts_step
            return ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp", "ffn_gate_inp", "ffn_gate_inp")
        return ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def mode() -> str:
    """"0" (off), "1" (every layer it can serve) or "auto" (GGSTATION_STEP)."""
    v = os.environ.get("GGSTATION_STEP", "auto").strip().lower()
    return {"0": "0", "off": "0", "1": "1", "on": "1"}.get(v, "auto")


# --- the generated module ----------------------------------------------------------------------

_HEADER = '''# GENERATED by engine/models/step.py for one layer signature: do not edit.
# {key}
import numpy as np
from numba import njit

from engine.ops import (_attn_p, _attn_s, _geglu, _rmsnorm, _rmsnorm_inplace, _rope, _swiglu,
                        _swiglu_fused, store_kv_f16, store_kv_f32)
{imports}


@njit(cache=True, fastmath=True, nogil=True, error_model="numpy")
def step(x, h, q, k, v, attn, o, gate, up, qkv, gu, router, attn_norm, ffn_norm, aux, wq, wk, wv, wo,
         wg, wu, wd, eps, pos, inv_freq, neox, mscale, kc, vc, seq, base, window, scale, softcap, sinks,
         rscale, par, n_split, split_len, kbits, kvals, sbuf, pm, pl, pacc, H, G, D, Dv):
    # x ... router: (T, width) views of the context's buffers for the ubatch's T tokens (qkv,
    # gu: the fused projections' outputs, router: the MoE router's logits; width 0 without);
    # aux: (bq, bk, bv) biases, (q_norm, k_norm), (post_attention_norm, post_ffw_norm), bo as
    # the spec has them, else one empty array
    T = x.shape[0]
{pre_attn}{qkv}
'''

_BODY = '''    q3 = q.reshape((T, H, D))
    k3 = k.reshape((T, G, D))
    _rope(q3, pos, inv_freq, neox, mscale)
    _rope(k3, pos, inv_freq, neox, mscale)
    for t in range(T):
        {store_k}(kc, seq[t], base[t] + pos[t], k[t])
        {store_v}(vc, seq[t], base[t] + pos[t], v[t])
    a3 = attn.reshape((T, H, Dv))
    if par:
        _attn_p(q3, kc, vc, seq, base, pos, window, scale, softcap, sinks, a3, n_split, split_len,
                kbits, kvals, sbuf, pm, pl, pacc)
    else:
        _attn_s(q3, kc, vc, seq, base, pos, window, scale, softcap, sinks, a3, n_split, split_len,
                kbits, kvals, sbuf, pm, pl, pacc)
    {mv_o}(wo, attn, o)
{post_attn}{residual}{ffn}'''

_FFN = '''{pre_ffn}{gate_up}
    {act}
    {mv_d}(wd, gate, o)
{post_ffn}{residual}'''

_MOE_FFN = '''    _rmsnorm(x, ffn_norm, eps, h)
    {mv_r}(wg, h, router)
'''

_EXPERTS = '''# GENERATED by engine/models/step.py for one MoE expert signature: do not edit.
# {key}
import numpy as np
from numba import njit

from engine.ops import _swiglu, _swiglu_oai
{imports}


@njit(cache=True, nogil=True, error_model="numpy")
def step(h, o, x, gate, up, y, wg, wu, wd, gb, ub, db, n_ff, ids, wts, sgate, sup, wsg, wsu, wsd, sfac):
    # One token's mixture of experts (moe.ffn, op for op; no fast-math, so that y * w and
    # o + y round apart as numpy's do): o = the shared expert's down(silu(gate h) * up h)
    # times sfac (when the layer has one, else 0), plus over j wts[j] times expert ids[j]'s
    # down(act(gate h + gb, up h + ub)) + db, experts in ascending order; then x += o.
    # h, o, x, y: (1, n_embd); gate, up: (1, n_ff); wg, wu, wd: every expert's rows; gb, ub,
    # db: every expert's biases (n_expert, width), or empty when the layer has none; sgate,
    # sup (1, shared width) and wsg, wsu, wsd the shared expert's.
    n = x.shape[1]
{shared}
    for j in range(ids.shape[0]):
        e = ids[j]
        wge = wg[e * n_ff:(e + 1) * n_ff]
        wue = wu[e * n_ff:(e + 1) * n_ff]
        wde = wd[e * n:(e + 1) * n]
{gate_up}
{biases}        {act}
        {mv_d}(wde, gate, y)
{down_bias}        w = wts[j]
        for i in range(n):
            y[0, i] *= w
        for i in range(n):
            o[0, i] += y[0, i]
    for i in range(n):
        x[0, i] += o[0, i]
'''


def _rp(w: QTensor, path: str) -> bool:
    return interleaved(w, QUANT_TYPES[w.qtype], path)


def _step_rows(w: QTensor, path: str) -> np.ndarray:
    """The rows a step passes w's kernels on the decode path: its interleaved copy or its raw rows."""
    if _rp(w, path):
        packed = w.packed
        assert packed is not None  # _servable checked the shape, and the type has the form
        return packed
    return _raw_rows(w.raw)


def _wrapper(w: QTensor, path: str, op: str):
    """The public wrapper of QuantType op that quants runs for w on the decode path."""
    return path_op(QUANT_TYPES[w.qtype], _rp(w, path), op, path)


def _same_x_kernel(w: QTensor, path: str) -> tuple[str, str]:
    """(module, name) of the njit kernel behind w's fused 1..3-weight mat-vec on the decode path
    (quants.matvec_many)."""
    f = _wrapper(w, path, "matvec_same_x")
    return f.__module__, "_" + f.__name__.replace("_same_x", "")


def _multi_same_x_kernel(w: QTensor, path: str) -> tuple[str, str] | None:
    """(module, name) of the kernel behind w's fused multi-token mat-vec of 1..3 weights
    (quants.matvec_multi_many), None when the type has none."""
    f = _wrapper(w, path, "matvec_multi_same_x")
    return None if f is None else (f.__module__, "_" + f.__name__)


def _multi_kernel(w: QTensor, path: str) -> tuple[str, str]:
    """(module, name) of the njit kernel behind quants.matvec_multi for w."""
    f = _wrapper(w, path, "matvec_multi")
    return f.__module__, "_" + f.__name__


def _groups(ws: list[QTensor]) -> list[list[int]]:
    """Indices of ws per launch, as quants.matvec_many groups them: one launch when every
    weight has the same type, else by type in order of first appearance, three at most."""
    if all(w.qtype == ws[0].qtype and w.pack == ws[0].pack for w in ws):
        return [list(range(len(ws)))]
    by: dict[Any, list[int]] = {}
    for i, w in enumerate(ws):
        by.setdefault((w.qtype, w.pack), []).append(i)
    return [g[i : i + 3] for g in by.values() for i in range(0, len(g), 3)]


class _Source:
    """Collects a generated module's imports under short local names."""

    def __init__(self) -> None:
        self.names: dict[tuple[str, str], str] = {}

    def name(self, ref: tuple[str, str]) -> str:
        if ref not in self.names:
            self.names[ref] = f"_k{len(self.names)}"
        return self.names[ref]

    def imports(self) -> str:
        return "\n".join(f"from {m} import {n} as {a}" for (m, n), a in self.names.items())


def _launches(src: _Source, ws: list[QTensor], args: list[str], x: str, outs: list[str], path: str,
              multi: bool) -> str:
    """The fused mat-vec launches of weights sharing x, grouped as quants groups them: one
    token (1-D rows of the buffers) or several (2-D)."""
    lines = []
    for g in _groups(ws):
        ref = _multi_same_x_kernel(ws[g[0]], path) if multi else _same_x_kernel(ws[g[0]], path)
        assert ref is not None  # _servable checked
        k = src.name(ref)
        r = [args[i] for i in g]
        o = [outs[i] if multi else f"{outs[i]}[0]" for i in g]
        while len(r) < 3:  # the empty weights quants' launchers pad with
            r.append(f"{r[0]}[:0]")
            o.append("np.empty((T, 0), np.float32)" if multi else f"{o[0]}[:0]")
        xa = x if multi else f"{x}[0]"
        lines.append(f"    {k}({r[0]}, {r[1]}, {r[2]}, {xa}, {o[0]}, {o[1]}, {o[2]})")
    return "\n".join(lines)


def render(spec: StepSpec, lw, kdtype: np.dtype, vdtype: np.dtype, path: str, multi: bool = False) -> str:
    """The source of the step module for layer weights lw (the layer's qtypes decide which
    kernels it calls): for one token, or (multi) for 2..MATVEC_MAX_TOKENS."""
    src = _Source()
    inp = "h" if spec.pre_norms else "x"  # what the sublayers read
    pre = "    _rmsnorm(x, {}, eps, h)\n"
    pre_attn = pre.format("attn_norm") if spec.pre_norms else ""
    pre_ffn = pre.format("ffn_norm") if spec.pre_norms else ""
    if spec.fused:
        qkv = _launches(src, [lw.attn_qkv], ["wq"], inp, ["qkv"], path, multi)
        qkv += ("\n    nq, nk = q.shape[1], k.shape[1]\n    for t in range(T):"
                "\n        for i in range(nq):\n            q[t, i] = qkv[t, i]"
                "\n        for i in range(nk):\n            k[t, i] = qkv[t, nq + i]"
                "\n        for i in range(v.shape[1]):\n            v[t, i] = qkv[t, nq + nk + i]")
        gate_up = _launches(src, [lw.ffn_up], ["wu"], inp, ["gu"], path, multi)
        act = "_swiglu_fused(gu, gate)"
    else:
        qkv = _launches(src, [lw.attn_q, lw.attn_k, lw.attn_v], ["wq", "wk", "wv"], inp, ["q", "k", "v"], path, multi)
        gate_up = "" if spec.moe else _launches(src, [lw.ffn_gate, lw.ffn_up], ["wg", "wu"], inp,
                                                ["gate", "up"], path, multi)
        act = f"{'_geglu' if spec.act == 'gelu' else '_swiglu'}(gate, up, gate)"
    aux = spec.aux.index
    if spec.qkv_bias:
        qkv += (f"\n    bq, bk, bv = aux[{aux('attn_q_bias')}], aux[{aux('attn_k_bias')}], aux[{aux('attn_v_bias')}]"
                "\n    for t in range(T):"
                "\n        for i in range(q.shape[1]):\n            q[t, i] += bq[i]"
                "\n        for i in range(k.shape[1]):\n            k[t, i] += bk[i]"
                "\n        for i in range(v.shape[1]):\n            v[t, i] += bv[i]")
    if spec.qk_norm == "head":
        qkv += (f"\n    qh = q.reshape((T * H, D))\n    _rmsnorm_inplace(qh, aux[{aux('attn_q_norm')}], eps)"
                f"\n    kh = k.reshape((T * G, D))\n    _rmsnorm_inplace(kh, aux[{aux('attn_k_norm')}], eps)")
    elif spec.qk_norm == "whole":
        qkv += (f"\n    _rmsnorm_inplace(q, aux[{aux('attn_q_norm')}], eps)"
                f"\n    _rmsnorm_inplace(k, aux[{aux('attn_k_norm')}], eps)")
    store = {np.dtype(np.uint16): "store_kv_f16", np.dtype(np.float32): "store_kv_f32"}
    post_attn = post_ffn = ""
    if spec.post_norms:
        post_attn = f"    _rmsnorm_inplace(o, aux[{aux('post_attention_norm')}], eps)\n"
        post_ffn = f"    _rmsnorm_inplace(o, aux[{aux('post_ffw_norm')}], eps)\n"
    scaled = "            o[t, i] *= rscale\n" if spec.residual_scale else ""
    residual = f"    for t in range(T):\n        for i in range(x.shape[1]):\n{scaled}            x[t, i] += o[t, i]\n"
    if spec.moe:
        ffn = _MOE_FFN.format(mv_r=src.name(_multi_kernel(lw.ffn_gate_inp, path)))
    else:
        ffn = _FFN.format(mv_d=src.name(_multi_kernel(lw.ffn_down, path)), post_ffn=post_ffn,
                          residual=residual, pre_ffn=pre_ffn, gate_up=gate_up, act=act)
    if spec.o_bias:
        post_attn = (f"    bo = aux[{aux('attn_output_bias')}]\n    for t in range(T):"
                     "\n        for i in range(o.shape[1]):\n            o[t, i] += bo[i]\n") + post_attn
    body = _BODY.format(
        store_k=store[np.dtype(kdtype)], store_v=store[np.dtype(vdtype)],
        mv_o=src.name(_multi_kernel(lw.attn_output, path)),
        post_attn=post_attn, residual=residual, ffn=ffn)
    tokens = f"2-{MATVEC_MAX_TOKENS}" if multi else "1"
    key = f"{spec} k={np.dtype(kdtype)} v={np.dtype(vdtype)} path={path} tokens={tokens}"
    return _HEADER.format(key=key, imports=src.imports(), pre_attn=pre_attn, qkv=qkv) + body


def render_experts(w: moe.MoeWeights, sh: moe.SharedExpert | None, path: str, act: str) -> str:
    """The source of the one-token experts module for a layer's experts w (their weight types
    and biases) and shared expert sh, with activation act ("silu" or "swiglu_oai")."""
    assert w.gate is not None  # _experts_servable
    src = _Source()
    gate_up = _launches(src, [w.gate.expert(0), w.up.expert(0)], ["wge", "wue"], "h", ["gate", "up"], path, False)
    gate_up = "\n".join("    " + ln for ln in gate_up.splitlines())
    biases = down_bias = ""
    add = "        for i in range({w}):\n            {buf}[0, i] += {b}[e, i]\n"
    if w.gate_bias is not None:
        biases += add.format(w="n_ff", buf="gate", b="gb")
    if w.up_bias is not None:
        biases += add.format(w="n_ff", buf="up", b="ub")
    if w.down_bias is not None:
        down_bias = add.format(w="n", buf="y", b="db")
    if act == "silu":
        act_call = "_swiglu(gate, up, gate)"
    elif act == "swiglu_oai":
        act_call = f"_swiglu_oai(gate, up, gate, np.float32({ops.OAI_ALPHA!r}), np.float32({ops.OAI_LIMIT!r}))"
    else:
        raise ValueError(f"no experts step for the activation {act!r}")
    mv_d = src.name(_multi_kernel(w.down.expert(0), path))
    if sh is not None:
        shared = _launches(src, [sh.gate, sh.up], ["wsg", "wsu"], "h", ["sgate", "sup"], path, False)
        mv_sd = src.name(_multi_kernel(sh.down, path))
        shared += (f"\n    _swiglu(sgate, sup, sgate)\n    {mv_sd}(wsd, sgate, o)"
                   "\n    for i in range(n):\n        o[0, i] *= sfac")
    else:
        shared = "    for i in range(n):\n        o[0, i] = 0.0"
    key = (f"experts {w.gate.qtype.name} {w.up.qtype.name} {w.down.qtype.name} path={path} act={act} "
           f"biases={bool(biases)},{bool(down_bias)} shared="
           + (" ".join(t.qtype.name for t in (sh.gate, sh.up, sh.down)) if sh is not None else "none"))
    return _EXPERTS.format(key=key, imports=src.imports(), gate_up=gate_up, biases=biases, act=act_call, mv_d=mv_d,
                           down_bias=down_bias, shared=shared)


_ENGINE_DIGEST: str | None = None


def _engine_digest() -> str:
    """Digest of the engine sources whose machine code a step links in (numba keeps a callee's
    code in its caller's cache entry, so a changed kernel needs a new step file)."""
    global _ENGINE_DIGEST
    if _ENGINE_DIGEST is None:
        root = Path(__file__).resolve().parent.parent
        try:
            files = [root / "ops.py", root / "jit.py", Path(__file__).resolve()]
            files += sorted((root / "quants").glob("*.py")) + sorted((root / "quants" / "generated").glob("*.py"))
            _ENGINE_DIGEST = jit.source_digest(files)
        except OSError:  # a frozen bundle: no sources, nothing can drift
            from ..version import __version__
            _ENGINE_DIGEST = hashlib.sha256(__version__.encode()).hexdigest()[:16]
        _ENGINE_DIGEST += "p" if jit.PORTABLE_LUT else ""
    return _ENGINE_DIGEST


def step_dir() -> Path:
    """Where step modules are written: GGSTATION_STEP_DIR, else beside numba's cache."""
    d = os.environ.get("GGSTATION_STEP_DIR")
    if d:
        return Path(d)
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ggstation")
    return Path(base) / "steps"


_modules: dict[str, Any] = {}
_lock = threading.Lock()
_pruned = False

# A step module written by another engine version (its name's prefix) is deleted, with numba's
# cache of it, once it is this old: after an upgrade the old ones would otherwise stay forever
# (~0.5 MB of machine code each). Not sooner: two installed versions may share the directory,
# and one that still runs rewrites what it needs.
STALE_AFTER_S = 7 * 86400


def _file_stem(digest: str) -> str:
    return f"step_{_engine_digest()[:8]}_{digest}"


def load_step(source: str) -> CPUDispatcher:
    """The step function of a rendered module (written once per content, then imported)."""
    digest = hashlib.sha256((_engine_digest() + source).encode()).hexdigest()[:20]
    with _lock:
        if digest in _modules:
            return _modules[digest].step
        d = step_dir()
        path = d / f"{_file_stem(digest)}.py"
        # written when absent, and again when its text is not ours (a file cut short or edited
        # by hand must not stop every context from being made)
        if not path.exists() or path.read_text(errors="replace") != source:
            d.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(source)
            os.replace(tmp, path)  # whole or absent for another process loading it
        name = f"ggstation_step_{digest}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _modules[digest] = mod
        return mod.step


def prune(d: Path, cache_dir: Path | None, now: float | None = None) -> int:
    """Delete the step modules in d that another engine version wrote over STALE_AFTER_S ago,
    with their files in numba's cache_dir, and temporary files a crash left (over a day
    old); returns how many modules went. Best effort: what cannot be read or deleted stays."""
    now = time.time() if now is None else now
    mine = f"step_{_engine_digest()[:8]}_"
    removed = 0
    try:
        entries = list(d.iterdir())
    except OSError:
        return 0
    for f in entries:
        try:
            age = now - f.stat().st_mtime
            if f.suffix == ".tmp" and age > 86400:
                f.unlink()
            if f.suffix != ".py" or not f.name.startswith("step_") or f.name.startswith(mine) or age < STALE_AFTER_S:
                continue
            if cache_dir is not None and cache_dir.is_dir():
                for c in cache_dir.glob(f"{f.stem}.*"):
                    c.unlink(missing_ok=True)
            f.unlink()
            removed += 1
        except OSError:
            continue
    return removed


def _prune_once(fn: CPUDispatcher) -> None:
    """prune() the step directory once per process, numba's cache located through fn's."""
    global _pruned
    if _pruned:
        return
    _pruned = True
    try:
        cache_dir: Path | None = Path(fn._cache._cache_path)  # type: ignore[attr-defined]  # numba's locator
    except AttributeError:  # another numba cache implementation: the modules alone
        cache_dir = None
    n = prune(step_dir(), cache_dir)
    if n:
        log.info("deleted %d decode step modules of other engine versions", n)


# --- per context -------------------------------------------------------------------------------

_EMPTY = np.zeros(0, np.float32)
_EMPTY2 = np.zeros((0, 0), np.float32)
_EMPTY_U8 = np.zeros((0, 0), np.uint8)
# buffers a step reads and writes, as UbatchState names them (the last two only some have)
_BUFFERS = ("x", "h", "q", "k", "v", "attn", "o", "gate", "up", "qkv", "gate_up", "router")


def _bufs(buf, T: int) -> tuple[np.ndarray, ...]:
    """The step's (T, width) buffer views; a fused projection's buffer the architecture does
    not have is (T, 0)."""
    have = vars(buf)
    return tuple(have[n][:T] if n in have else np.empty((T, 0), np.float32) for n in _BUFFERS)


def _servable(spec: StepSpec, lw, auto: bool, multi: bool, path: str) -> bool:
    ws = [w for n in spec.weights if isinstance(w := getattr(lw, n, None), QTensor)]
    if len(ws) < len(spec.weights):  # an expert stack or a weight of another kind
        return False
    for w in ws:
        qt = QUANT_TYPES.get(w.qtype)
        if qt is None or w.n_cols % qt.block_elems or qt.matvec_same_x is None:
            return False
        if multi and _multi_same_x_kernel(w, path) is None:
            return False
    stacks = [w for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
              if isinstance(w := getattr(lw, n, None), ExpertTensor)] if spec.moe else []
    return not auto or sum(w.nbytes for w in {id(w): w for w in ws + stacks}.values()) >= MIN_LAYER_BYTES


def _experts_servable(w: moe.MoeWeights, sh: moe.SharedExpert | None, act: str) -> bool:
    """Whether a MoE layer's experts w (and shared expert sh) suit the experts step: stacks and
    weights of types with fused mat-vec kernels, and an activation it has."""
    if act not in ("silu", "swiglu_oai") or w.gate is None:
        return False
    ws: list[Any] = [w.gate, w.up, w.down] + ([sh.gate, sh.up, sh.down] if sh is not None else [])
    for t in ws:
        qt = QUANT_TYPES.get(t.qtype) if isinstance(t, (QTensor, ExpertTensor)) else None
        if qt is None or t.n_cols % qt.block_elems or qt.matvec_same_x is None:
            return False
    return True


def layer_spec(spec: StepSpec, lw) -> StepSpec:
    """The architecture's spec as layer lw has it: Q/K/V biases are optional in some (qwen2moe)."""
    if spec.qkv_bias and getattr(lw, "attn_q_bias", None) is None:
        return replace(spec, qkv_bias=False)
    return spec


class LayerSteps:
    """A context's compiled layer steps: per layer the step function for one token and for
    2..MATVEC_MAX_TOKENS (None: the Python block serves it), and the arguments that do not
    change from token to token. The several-token ones are made for contexts with several
    sequences, whose slots decode together."""

    def __init__(self, ctx, spec: StepSpec, path: str):
        self.kv, self.path, self.buf = ctx.kv, path, ctx.buf
        cfg, kv = ctx.cfg, ctx.kv
        auto = mode() == "auto"
        multi = ctx.n_seq_max > 1 and ctx.n_ubatch > 1
        self.one: list[Any] = []
        self.many: list[Any] = []
        self.args: list[tuple] = []
        self.H, self.G, self.D, self.Dv = cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v
        eps = np.float32(cfg.norm_eps)
        softcap = np.float32(cfg.attn_logit_softcap if spec.attn_softcap else 0.0)
        # multiplying by 1 is exact: granite without a residual_scale gives the same bits
        rscale = np.float32((cfg.residual_scale or 1.0) if spec.residual_scale else 1.0)
        self.moe = cfg.moe if spec.moe else None
        # per MoE layer: its weights (moe.layer_weights), and its experts step with the
        # arguments that do not change (experts' rows and biases, n_ff; the shared expert's
        # rows); None elsewhere
        self.moe_w: list[tuple[moe.MoeWeights, moe.SharedExpert | None] | None] = []
        self.experts: list[tuple[Any, tuple, tuple] | None] = []
        for il, lw in enumerate(ctx.model.weights.layers):
            kc, vc = kv.k[il], kv.v[il]
            ok = _servable(spec, lw, auto, False, path) and kc.shape[1] > 0 and kc.dtype in (np.uint16, np.float32)
            # (a layer of a MoE architecture without an expert stack keeps the Python block)
            has_experts = isinstance(getattr(lw, "ffn_gate_exps", None), ExpertTensor)
            mw = moe.layer_weights(lw) if ok and spec.moe and has_experts else None
            if not ok or spec.moe and (mw is None or not _experts_servable(*mw, cfg.moe.act)):
                self.one.append(None)
                self.many.append(None)
                self.args.append(())
                self.moe_w.append(None)
                self.experts.append(None)
                continue
            ls = layer_spec(spec, lw)
            self.one.append(load_step(render(ls, lw, kc.dtype, vc.dtype, path)))
            self.many.append(load_step(render(ls, lw, kc.dtype, vc.dtype, path, multi=True))
                             if multi and _servable(spec, lw, auto, True, path) else None)
            self.moe_w.append(mw)
            if mw is not None:
                w, sh = mw
                assert w.gate is not None
                self.experts.append((
                    load_step(render_experts(w, sh, path, cfg.moe.act)),
                    (*(_raw_rows(t.raw) for t in (w.gate, w.up, w.down)),
                     *(_EMPTY2 if b is None else b for b in (w.gate_bias, w.up_bias, w.down_bias)), w.gate.n_rows),
                    tuple(_step_rows(t, path) for t in (sh.gate, sh.up, sh.down)) if sh is not None
                    else (_EMPTY_U8,) * 3))
            else:
                self.experts.append(None)
            aux = tuple(getattr(lw, n) for n in ls.aux)  # render reads them by ls.aux's indices
            rope = kv.rope[il]
            norms = (lw.attn_norm, getattr(lw, spec.ffn_norm)) if spec.pre_norms else (_EMPTY, _EMPTY)
            self.args.append((
                *norms, aux or (_EMPTY,),
                *(_step_rows(getattr(lw, n), path) for n in spec.weights), eps,
                rope.inv_freq, rope.neox, float(rope.attn_factor), kc, vc,
                kv.window[il], np.float32(cfg.kq_scale), softcap, lw.attn_sinks if spec.sinks else ops._NO_SINKS,
                rscale))
        self.any = any(f is not None for f in self.one)
        if self.any:
            _prune_once(next(f for f in self.one if f is not None))
        t0 = time.perf_counter()
        self._compile()
        if time.perf_counter() - t0 > 1.0:
            log.warning("compiled the decode steps of this model in %.1f s (cached for later starts)",
                        time.perf_counter() - t0)

    def _call_args(self, il: int, bufs: tuple, pos: np.ndarray, seq: np.ndarray, base: np.ndarray,
                   plan: ops.AttentionPlan) -> tuple:
        a = self.args[il]
        return (*bufs, *a[:11], pos, *a[11:16], seq, base, *a[16:], plan.parallel, *plan.args(),
                self.H, self.G, self.D, self.Dv)

    def _compile(self) -> None:
        """Compile (or load from numba's cache) each distinct step now, for the argument types
        of a decode, so that the first token does not pay for it."""
        b = self.buf
        seen: set[int] = set()
        for fns, T in ((self.one, 1), (self.many, 2)):
            plan = ops.AttentionPlan(T, self.H, self.G, self.D, self.Dv, 1, 0)
            bufs = _bufs(b, T)
            pos, cells = np.zeros(T, np.int32), np.zeros(T, np.int64)
            for il, fn in enumerate(fns):
                if fn is None or id(fn) in seen:
                    continue
                seen.add(id(fn))
                fn.compile(tuple(numba.typeof(v) for v in self._call_args(il, bufs, pos, cells, cells, plan)))
        for ex in self.experts:
            if ex is not None and id(ex[0]) not in seen:
                seen.add(id(ex[0]))
                ids, wts = np.zeros(1, np.int64), np.zeros(1, np.float32)
                args = (*self._expert_bufs(b, 1), *ex[1], ids, wts, b.gate[:1], b.up[:1], *ex[2], np.float32(1))
                ex[0].compile(tuple(numba.typeof(v) for v in args))

    @staticmethod
    def _expert_bufs(buf, T: int) -> tuple[np.ndarray, ...]:
        """h, o, x, gate, up and out of the experts step (1-token views of the buffers)."""
        return (buf.h[:T], buf.o[:T], buf.x[:T], buf.moe_gate[:T], buf.moe_up[:T], buf.moe_out[:T])

    def run_experts(self, il: int, s) -> None:
        """Layer il's mixture of experts for ubatch s from the router logits its step left in
        buf.router. One token: moe.route picks the experts (as moe.ffn does) and the experts
        step runs them and adds their sum to x. Several: moe.ffn runs them from the logits
        (per expert over its tokens; one experts-step call per token was tried: slower at four
        tokens, and on the float path not the bits of moe.ffn's grouped mat-vecs)."""
        mw, ex, buf = self.moe_w[il], self.experts[il], s.buf
        assert mw is not None and ex is not None and self.moe is not None
        w, sh = mw
        if s.n_tokens > 1:
            s.x += moe.ffn(s, s.h, w, self.moe, sh, logits=buf.router[: s.n_tokens])
            return
        fn, wargs, shared = ex
        sfac = np.float32(1.0)  # an ungated shared expert's output is multiplied by 1: exact
        if sh is not None and sh.gate_inp is not None:  # as moe.shared_ffn: numpy's dot and sigmoid
            sfac = (1.0 / (1.0 + np.exp(-(buf.h[:1] @ sh.gate_inp)))).astype(np.float32)[0]
        experts, weights = moe.route(buf.router[:1], self.moe, w.router_bias, w.probs_bias)
        order = np.argsort(experts[0], kind="stable")  # run_experts' order: ascending experts
        fn(*self._expert_bufs(buf, 1), *wargs, np.ascontiguousarray(experts[0][order]),
           np.ascontiguousarray(weights[0][order]), buf.gate[:1], buf.up[:1], *shared, sfac)

    def for_ubatch(self, s) -> UbatchSteps | None:
        """The steps for ubatch s (its T tokens, every one decoding: T <= MATVEC_MAX_TOKENS),
        or None when they have no step for T tokens."""
        if s.n_tokens > MATVEC_MAX_TOKENS or (s.n_tokens > 1 and not any(f is not None for f in self.many)):
            return None
        return UbatchSteps(self, s)


class UbatchSteps:
    """One ubatch's run through the layer steps: its buffers, cells and attention plans."""

    def __init__(self, steps: LayerSteps, s):
        self.steps, self.s = steps, s
        self.fns = steps.one if s.n_tokens == 1 else steps.many
        self.bufs = _bufs(s.buf, s.n_tokens)
        self.seq, self.base = s.kv.token_cells(s.seq_id)
        self.n_pos = int(s.pos.max()) + 1
        self.plans: dict[int, ops.AttentionPlan] = {}  # per sliding-window size

    def run(self, il: int) -> bool:
        """Layer il through its step; False when it has none (the caller runs the block)."""
        fn = self.fns[il]
        if fn is None:
            return False
        st = self.steps
        window = st.args[il][16]
        plan = self.plans.get(window)
        if plan is None:
            plan = self.plans[window] = ops.AttentionPlan(self.s.n_tokens, st.H, st.G, st.D, st.Dv, self.n_pos, window)
        fn(*st._call_args(il, self.bufs, self.s.pos, self.seq, self.base, plan))
        if st.moe is not None:
            st.run_experts(il, self.s)
        return True


def for_context(ctx) -> LayerSteps | None:
    """The context's layer steps (built with the context, rebuilt when the KV cache or the
    decode path changes), or None where none serves."""
    spec = ctx.model.arch.step
    if spec is None or mode() == "0":
        return None
    path = decode_path()
    steps = getattr(ctx, "_layer_steps", None)
    if steps is None or steps.kv is not ctx.kv or steps.path != path:
        try:
            steps = LayerSteps(ctx, spec, path)
        except Exception as e:  # no writable directory, or a step numba cannot build: a bug, but
            # decoding through the Python blocks still gives the same logits (tests force steps on)
            log.warning("compiled decode steps unavailable (%s: %s); decoding through the Python blocks",
                        type(e).__name__, e)
            steps = None
        ctx._layer_steps = steps
    return steps if steps is not None and steps.any else None


__all__ = ["StepSpec", "LayerSteps", "UbatchSteps", "for_context", "load_step", "prune", "render", "render_experts",
           "mode"]
