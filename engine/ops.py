"""Float kernels of the forward pass: RMSNorm, RoPE, gated activations, decode attention.

All operate in place on preallocated buffers; none allocates inside a prange body.
The KV cache may be stored as float16 bits (uint16); numba converts blocks of them
(`_f16_block`) since it has no float16 scalar type.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from . import parallel
from .jit import kernel, parallel_kernel


def _rmsnorm_rows(x, w, eps, out):  # x, out (T, E); w (E,)
    T, E = x.shape
    for t in prange(T):
        ss = 0.0
        for i in range(E):
            ss += x[t, i] * x[t, i]
        scale = 1.0 / math.sqrt(ss / E + eps)
        for i in range(E):
            out[t, i] = x[t, i] * scale * w[i]


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out = x / rms(x) * w, row-wise; x and out may be the same buffer."""
    _rows(lambda x_, out_: _rmsnorm(x_, w, np.float32(eps), out_), x.shape[0], x, out)


def _rope_rows(x, pos, inv_freq, neox, mscale):  # x (T, H, D) in place; pos (T,)
    T, H = x.shape[0], x.shape[1]
    half = inv_freq.shape[0]
    for t in prange(T):
        for i in range(half):
            theta = pos[t] * inv_freq[i]
            c = np.float32(math.cos(theta) * mscale)
            s = np.float32(math.sin(theta) * mscale)
            if neox:
                i0, i1 = i, i + half
            else:
                i0, i1 = 2 * i, 2 * i + 1
            for h in range(H):
                a = x[t, h, i0]
                b = x[t, h, i1]
                x[t, h, i0] = a * c - b * s
                x[t, h, i1] = a * s + b * c


def rope(x: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray, neox: bool,
         mscale: float = 1.0) -> None:
    """Rotate the first 2*len(inv_freq) dims of every head of x (T, H, D) in place by token
    positions (angle pos * inv_freq[i] for pair i, see config.Rope); cos and sin are
    multiplied by mscale (LongRoPE's attention factor)."""
    _rows(lambda x_, p_: _rope(x_, p_, inv_freq, neox, float(mscale)), x.shape[0], x, pos)


def _swiglu_rows(g, u, out):  # (T, F)
    T, F = g.shape
    for t in prange(T):
        for i in range(F):
            v = g[t, i]
            out[t, i] = v / (1.0 + math.exp(-v)) * u[t, i]


def _geglu_rows(g, u, out):  # tanh-approximated GELU, as ggml_gelu
    T, F = g.shape
    c = math.sqrt(2.0 / math.pi)
    for t in prange(T):
        for i in range(F):
            v = g[t, i]
            # 0.5*v*(1+tanh(z)) == v*sigmoid(2z); exp is much cheaper than tanh here
            z = c * (v + 0.044715 * v * v * v)
            out[t, i] = v / (1.0 + math.exp(-2.0 * z)) * u[t, i]


def _swiglu_fused_rows(gu, out):  # gu (T, 2F): gate | up halves of one fused projection
    T, F = out.shape
    for t in prange(T):
        for i in range(F):
            v = gu[t, i]
            out[t, i] = v / (1.0 + math.exp(-v)) * gu[t, F + i]


# ggml_swiglu_oai's constants as llama.cpp's gpt-oss graph passes them
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0


def _swiglu_oai_rows(g, u, out, alpha, limit):  # (T, F); gate clipped above, up both ways
    T, F = g.shape
    for t in prange(T):
        for i in range(F):
            x = min(g[t, i], limit)
            y = min(max(u[t, i], -limit), limit)
            out[t, i] = x / (1.0 + math.exp(-alpha * x)) * (y + 1.0)


_rmsnorm = kernel(_rmsnorm_rows)
_rope = kernel(_rope_rows)
_swiglu = kernel(_swiglu_rows)
_geglu = kernel(_geglu_rows)
_swiglu_fused = kernel(_swiglu_fused_rows)
_swiglu_oai = kernel(_swiglu_oai_rows)

# From this many rows on, rows are split over engine.parallel's workers (a thread wake-up
# costs more than it saves below it).
PARALLEL_MIN_ROWS = 8


def _rows(fn, n_rows: int, *rows) -> None:
    """fn(*rows) for a row-wise serial kernel, rows split over the workers when there are many
    (every argument is an array of n_rows rows)."""
    if n_rows < PARALLEL_MIN_ROWS or parallel.pool_size() == 1:
        fn(*rows)
        return
    parts = parallel.split(n_rows, parallel.pool_size())

    def run(p, _w):
        a, e = parts[p]
        fn(*(x[a:e] for x in rows))

    parallel.run_parts(run, len(parts))


def gated_act(act: str, g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """out = act(g) * u with act "silu" or "gelu" (tanh approximation); out may alias g."""
    _rows(_geglu if act == "gelu" else _swiglu, g.shape[0], g, u, out)


def swiglu_oai(g: np.ndarray, u: np.ndarray, out: np.ndarray, alpha: float = OAI_ALPHA,
               limit: float = OAI_LIMIT) -> None:
    """out = x * sigmoid(alpha * x) * (y + 1) with x = min(g, limit), y = clamp(u, +-limit)
    (ggml_swiglu_oai, gpt-oss's expert activation); out may alias g."""
    a, lim = np.float32(alpha), np.float32(limit)
    _rows(lambda g_, u_, o_: _swiglu_oai(g_, u_, o_, a, lim), g.shape[0], g, u, out)


def swiglu_fused(gu: np.ndarray, out: np.ndarray) -> None:
    """out (T, F) = silu(gu[:, :F]) * gu[:, F:] for a fused gate|up projection (T, 2F)."""
    _rows(_swiglu_fused, gu.shape[0], gu, out)


def _attn_f32_body(q, k, v, seq, pos, window, scale, softcap, sinks, out, scores):
    # q (T, H, D); k (S, C, G, D); v (S, C, G, Dv); out (T, H, Dv); scores (T*H, C) scratch
    # softcap > 0: scores -> softcap * tanh(scores / softcap) before the softmax (gemma2)
    # sinks (H,) or (0,): a per-head logit that joins the softmax denominator only (gpt-oss)
    T, H, D = q.shape
    G = k.shape[2]
    Dv = v.shape[3]
    rep = H // G
    for th in prange(T * H):
        t = th // H
        h = th % H
        g = h // rep
        s = seq[t]
        p = pos[t]
        lo = 0
        if window > 0 and p - window + 1 > 0:
            lo = p - window + 1
        mx = -1e30
        for j in range(lo, p + 1):
            acc = 0.0
            for d in range(D):
                acc += q[t, h, d] * k[s, j, g, d]
            acc *= scale
            if softcap > 0.0:
                acc = softcap * math.tanh(acc / softcap)
            scores[th, j] = acc
            if acc > mx:
                mx = acc
        if sinks.shape[0] and sinks[h] > mx:
            mx = sinks[h]
        tot = 0.0
        for j in range(lo, p + 1):
            e = math.exp(scores[th, j] - mx)
            scores[th, j] = e
            tot += e
        if sinks.shape[0]:
            tot += math.exp(sinks[h] - mx)
        inv = 1.0 / tot
        for d in range(Dv):
            out[t, h, d] = 0.0
        for j in range(lo, p + 1):
            w = scores[th, j] * inv
            for d in range(Dv):
                out[t, h, d] += w * v[s, j, g, d]


# Keys/values are converted 64 positions at a time into a per-thread float32 block.
KV_BLOCK = 64
_TWO112 = np.float32(2.0**112)


@kernel
def _f16_block(src, s, j0, n, g, bits, vals):
    """float16 bits src[s, j0:j0+n, g, :] -> vals[:n] float32 (bits aliases vals' memory).

    Branch-free so that LLVM vectorises it: move exponent+mantissa into float32 position and
    rescale by 2^112 (exact for normals and subnormals); apply the sign last.
    """
    D = src.shape[3]
    for jj in range(n):
        for d in range(D):
            bits[jj, d] = np.uint32(src[s, j0 + jj, g, d] & 0x7FFF) << 13
    for jj in range(n):
        for d in range(D):
            sign = np.float32(1.0) - np.float32(2.0) * np.float32(src[s, j0 + jj, g, d] >> 15)
            vals[jj, d] = vals[jj, d] * _TWO112 * sign


def _attn_f16_body(q, k, v, seq, pos, window, scale, softcap, sinks, out, scores, kbits, kvals):
    # As _attn_f32 with k, v holding float16 bits (uint16). One iteration per (token, KV head):
    # each block of keys/values is converted once and used by all heads sharing that KV head.
    # kbits/kvals: per-thread (n_threads, KV_BLOCK, D) scratch, two views of one buffer.
    T, H, D = q.shape
    G = k.shape[2]
    Dv = v.shape[3]
    rep = H // G
    for tg in prange(T * G):
        tid = numba.get_thread_id()
        bits, vals = kbits[tid], kvals[tid]
        t = tg // G
        g = tg % G
        s = seq[t]
        p = pos[t]
        lo = 0
        if window > 0 and p - window + 1 > 0:
            lo = p - window + 1
        h0 = g * rep
        row0 = t * H + h0  # scores rows of this group's heads
        for j0 in range(lo, p + 1, KV_BLOCK):
            n = min(KV_BLOCK, p + 1 - j0)
            _f16_block(k, s, j0, n, g, bits, vals)
            for r in range(rep):
                for jj in range(n):
                    acc = np.float32(0.0)
                    for d in range(D):
                        acc += q[t, h0 + r, d] * vals[jj, d]
                    scores[row0 + r, j0 + jj] = acc * scale
        for r in range(rep):
            if softcap > 0.0:
                for j in range(lo, p + 1):
                    scores[row0 + r, j] = softcap * math.tanh(scores[row0 + r, j] / softcap)
            mx = np.float32(-1e30)
            for j in range(lo, p + 1):
                if scores[row0 + r, j] > mx:
                    mx = scores[row0 + r, j]
            if sinks.shape[0] and sinks[h0 + r] > mx:
                mx = sinks[h0 + r]
            tot = np.float32(0.0)
            for j in range(lo, p + 1):
                e = np.float32(math.exp(scores[row0 + r, j] - mx))
                scores[row0 + r, j] = e
                tot += e
            if sinks.shape[0]:
                tot += np.float32(math.exp(sinks[h0 + r] - mx))
            inv = np.float32(1.0) / tot
            for j in range(lo, p + 1):
                scores[row0 + r, j] *= inv
            for d in range(Dv):
                out[t, h0 + r, d] = 0.0
        for j0 in range(lo, p + 1, KV_BLOCK):
            n = min(KV_BLOCK, p + 1 - j0)
            _f16_block(v, s, j0, n, g, bits, vals)
            for r in range(rep):
                for jj in range(n):
                    w = scores[row0 + r, j0 + jj]
                    for d in range(Dv):
                        out[t, h0 + r, d] += w * vals[jj, d]


_attn_f32_s, _attn_f32_p = kernel(_attn_f32_body), parallel_kernel(_attn_f32_body)
_attn_f16_s, _attn_f16_p = kernel(_attn_f16_body), parallel_kernel(_attn_f16_body)
# Below this many multiply-adds a parallel region's thread wake-up costs more than it saves.
ATTN_PARALLEL_MIN_WORK = 1 << 20

_scratch: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _block_scratch(d: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-thread (KV_BLOCK, d) conversion blocks, as uint32 and float32 views of one buffer
    (allocated once per head size; 16 KiB a thread for d = 64)."""
    if d not in _scratch:
        buf = np.zeros((numba.config.NUMBA_NUM_THREADS, KV_BLOCK, d), np.float32)
        _scratch[d] = (buf.view(np.uint32), buf)
    return _scratch[d]


_NO_SINKS = np.zeros(0, np.float32)


def attention_tokens(q, k, v, seq, pos, window, scale, softcap, out, scores,
                     sinks: np.ndarray | None = None) -> None:
    """Per-token attention over the cache (decode path): each token attends to its own
    sequence's positions [max(0, pos-window+1), pos]. k/v: float32 or float16 bits (uint16).
    Scores are q.k * scale, then softcap * tanh(score / softcap) when softcap > 0. sinks
    (n_head,) float32: head h's softmax denominator also holds exp(sinks[h]) (ggml_soft_max_ext
    with sinks), so its weights may sum to less than one."""
    sk = _NO_SINKS if sinks is None else sinks
    work = q.shape[0] * q.shape[1] * (int(pos.max()) + 1) * (k.shape[3] + v.shape[3])
    big = work >= ATTN_PARALLEL_MIN_WORK
    if k.dtype == np.uint16:
        kbits, kvals = _block_scratch(max(k.shape[3], v.shape[3]))
        fn = _attn_f16_p if big else _attn_f16_s
        fn(q, k, v, seq, pos, window, np.float32(scale), np.float32(softcap), sk, out, scores,
           kbits, kvals)
    else:
        fn = _attn_f32_p if big else _attn_f32_s
        fn(q, k, v, seq, pos, window, np.float32(scale), np.float32(softcap), sk, out, scores)


def attention_chunk(q, kf, vf, pos, window, scale, softcap, out,
                    sinks: np.ndarray | None = None) -> None:
    """Batch attention for one sequence's chunk with numpy BLAS (prefill path).

    q (m, H, D) queries at positions pos (m,); kf (L, G, D) and vf (L, G, Dv) float32 keys and
    values for positions 0..L-1 of that sequence; out (m, H, Dv). softcap and sinks as
    attention_tokens.
    """
    m, H, D = q.shape
    L, G, _ = kf.shape
    rep = H // G
    kpos = np.arange(L)
    mask = kpos[None, :] > pos[:, None]  # (m, L) causal
    if window > 0:
        mask |= kpos[None, :] <= (pos[:, None] - window)
    neg = np.where(mask, np.float32(-np.inf), np.float32(0.0))
    for g in range(G):
        qg = q[:, g * rep : (g + 1) * rep, :].transpose(1, 0, 2).reshape(rep * m, D)
        s = qg @ kf[:, g, :].T  # (rep*m, L)
        s *= scale
        if softcap > 0:
            s /= softcap
            np.tanh(s, out=s)
            s *= softcap
        s = s.reshape(rep, m, L)
        s += neg[None]
        mx = s.max(axis=2, keepdims=True)  # (rep, m, 1)
        if sinks is not None:
            sk = sinks[g * rep : (g + 1) * rep, None, None]
            mx = np.maximum(mx, sk)
        s -= mx
        np.exp(s, out=s)
        tot = s.sum(axis=2, keepdims=True)
        if sinks is not None:
            tot += np.exp(sk - mx)
        s /= tot
        og = s.reshape(rep * m, L) @ vf[:, g, :]  # (rep*m, Dv)
        out[:, g * rep : (g + 1) * rep, :] = og.reshape(rep, m, -1).transpose(1, 0, 2)
