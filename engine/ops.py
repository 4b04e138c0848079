"""Float kernels of the forward pass: RMSNorm, RoPE, gated activations, decode attention.

All operate in place on preallocated buffers; none allocates inside a prange body.
The KV cache may be stored as float16 bits (uint16); numba converts blocks of them
(`_load_block`) since it has no float16 scalar type.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload
from numba.np.ufunc.parallel import _launch_threads

from . import parallel
from .jit import kernel, serial_and_parallel


@kernel
def _inv_rms(x, t, eps):
    """1 / rms of row t of x (T, E), eps inside the root (float64 sum of squares)."""
    E = x.shape[1]
    ss = 0.0
    for i in range(E):
        ss += x[t, i] * x[t, i]
    return 1.0 / math.sqrt(ss / E + eps)


def _rmsnorm_rows(x, w, eps, out):  # x, out (T, E); w (E,)
    for t in prange(x.shape[0]):
        scale = _inv_rms(x, t, eps)
        for i in range(x.shape[1]):
            out[t, i] = x[t, i] * scale * w[i]


def _rmsnorm_inplace_rows(x, w, eps):  # x (T, E) in place
    # _rmsnorm_rows with out = x ran 3x slower: LLVM's vectoriser guards the store against
    # the loads it might overlap and, seeing x and out overlap, took the scalar loop
    for t in prange(x.shape[0]):
        scale = _inv_rms(x, t, eps)
        for i in range(x.shape[1]):
            x[t, i] = x[t, i] * scale * w[i]


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out = x / rms(x) * w, row-wise; x and out may be the same buffer (the same results)."""
    if out is x:
        by_rows(lambda x_: _rmsnorm_inplace(x_, w, np.float32(eps)), x.shape[0], x)
    else:
        by_rows(lambda x_, out_: _rmsnorm(x_, w, np.float32(eps), out_), x.shape[0], x, out)


@kernel
def _rotate(x, t, i, half, c, s, neox):
    """Pair i of every head of token t of x (T, H, D) turned by the angle with cos c, sin s:
    dims (i, i + half) with neox, (2i, 2i + 1) without."""
    if neox:
        i0, i1 = i, i + half
    else:
        i0, i1 = 2 * i, 2 * i + 1
    for h in range(x.shape[1]):
        a = x[t, h, i0]
        b = x[t, h, i1]
        x[t, h, i0] = a * c - b * s
        x[t, h, i1] = a * s + b * c


def _rope_rows(x, pos, inv_freq, neox, mscale):  # x (T, H, D) in place; pos (T,)
    half = inv_freq.shape[0]
    for t in prange(x.shape[0]):
        for i in range(half):
            theta = pos[t] * inv_freq[i]
            _rotate(
                x,
                t,
                i,
                half,
                np.float32(math.cos(theta) * mscale),
                np.float32(math.sin(theta) * mscale),
                neox,
            )


def rope(
    x: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray, neox: bool, mscale: float = 1.0
) -> None:
    """Rotate the first 2*len(inv_freq) dims of every head of x (T, H, D) in place by token
    positions (angle pos * inv_freq[i] for pair i, see config.Rope); cos and sin are
    multiplied by mscale (LongRoPE's attention factor)."""
    by_rows(lambda x_, p_: _rope(x_, p_, inv_freq, neox, float(mscale)), x.shape[0], x, pos)


def _rope_table_rows(pos, inv_freq, mscale, cs):  # cs (T, half, 2): cos, sin as _rope_rows has them
    T, half = pos.shape[0], inv_freq.shape[0]
    for t in range(T):
        for i in range(half):
            theta = pos[t] * inv_freq[i]
            cs[t, i, 0] = np.float32(math.cos(theta) * mscale)
            cs[t, i, 1] = np.float32(math.sin(theta) * mscale)


def _rope_apply_rows(x, cs, neox):  # x (T, H, D) in place by the table of _rope_table_rows
    half = cs.shape[1]
    for t in range(x.shape[0]):
        for i in range(half):
            _rotate(x, t, i, half, cs[t, i, 0], cs[t, i, 1], neox)


def rope_table(pos: np.ndarray, inv_freq: np.ndarray, mscale: float = 1.0) -> np.ndarray:
    """(T, len(inv_freq), 2) float32 cos and sin of each token's angles, as `rope` computes
    them: a prompt's queries and keys, and every layer with the same RoPE, share one table
    instead of each computing T * n_rot / 2 cosines and sines again."""
    cs = np.empty((pos.shape[0], inv_freq.shape[0], 2), np.float32)
    by_rows(lambda p_, c_: _rope_table(p_, inv_freq, float(mscale), c_), pos.shape[0], pos, cs)
    return cs


def rope_apply(x: np.ndarray, cs: np.ndarray, neox: bool) -> None:
    """`rope` of x (T, H, D) in place from a rope_table of its positions: the same results."""
    by_rows(lambda x_, c_: _rope_apply(x_, c_, neox), x.shape[0], x, cs)


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
_rmsnorm_inplace = kernel(_rmsnorm_inplace_rows)
_rope = kernel(_rope_rows)
_rope_table = kernel(_rope_table_rows)
_rope_apply = kernel(_rope_apply_rows)
_swiglu_oai = kernel(_swiglu_oai_rows)

# From this many rows on, rows are split over engine.parallel's workers (a thread wake-up
# costs more than it saves below it).
PARALLEL_MIN_ROWS = 8


def by_rows(fn, n_rows: int, *rows) -> None:
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
    by_rows(_geglu if act == "gelu" else _swiglu, g.shape[0], g, u, out)


def swiglu_oai(
    g: np.ndarray,
    u: np.ndarray,
    out: np.ndarray,
    alpha: float = OAI_ALPHA,
    limit: float = OAI_LIMIT,
) -> None:
    """out = x * sigmoid(alpha * x) * (y + 1) with x = min(g, limit), y = clamp(u, +-limit)
    (ggml_swiglu_oai, gpt-oss's expert activation); out may alias g."""
    a, lim = np.float32(alpha), np.float32(limit)
    by_rows(lambda g_, u_, o_: _swiglu_oai(g_, u_, o_, a, lim), g.shape[0], g, u, out)


def swiglu_fused(gu: np.ndarray, out: np.ndarray) -> None:
    """out (T, F) = silu(gu[:, :F]) * gu[:, F:] for a fused gate|up projection (T, 2F)."""
    by_rows(_swiglu_fused, gu.shape[0], gu, out)


# Keys/values are read KV_BLOCK positions at a time into a per-thread float32 block.
KV_BLOCK = 64
# ... or fewer, so that a block stays at 16 KiB (L1-resident beside the accumulators):
# 16 positions for 256-wide heads (gemma3) ran 10-20 % faster than 64.
BLOCK_FLOATS = 4096
_TWO112 = np.float32(2.0**112)
_NEG = np.float32(-1e30)  # "minus infinity" that fastmath (no-infs) keeps finite


@intrinsic
def _f16_row(typingctx, src, s, j, g, dst, jj):
    """dst[jj, :D] = src[s, j, g, :D] as float32: src (S, C, G, D) float16 bits, D a multiple of
    16, 16 halves per step through quants._ir's half_to_float (one vcvtph2ps with F16C, vector
    integer arithmetic without). Its machine code is cached with the kernels that call it (in
    this file's cache entries): an edit to half_to_float needs this file touched too."""
    sig = types.void(src, s, j, g, dst, jj)

    def codegen(context, builder, signature, args):
        from llvmlite import ir

        from .quants._ir import _arr, make_emit

        srcv, sv, jv, gv, dstv, jjv = args
        i64, i8p = ir.IntType(64), ir.IntType(8).as_pointer()
        v16h, v16f = ir.VectorType(ir.IntType(16), 16), ir.VectorType(ir.FloatType(), 16)

        def idx(i):
            return context.cast(builder, args[i], signature.args[i], types.int64)

        sa = _arr(context, builder, signature.args[0], srcv)
        da = _arr(context, builder, signature.args[4], dstv)
        st = cgutils.unpack_tuple(builder, sa.strides)
        off = builder.add(
            builder.add(builder.mul(idx(1), st[0]), builder.mul(idx(2), st[1])),
            builder.mul(idx(3), st[2]),
        )
        p = builder.gep(builder.bitcast(sa.data, i8p), [off])
        q = builder.gep(
            builder.bitcast(da.data, i8p),
            [builder.mul(idx(5), cgutils.unpack_tuple(builder, da.strides)[0])],
        )
        em = make_emit(context, builder)
        n16 = builder.udiv(cgutils.unpack_tuple(builder, sa.shape)[3], ir.Constant(i64, 16))
        with cgutils.for_range(builder, n16) as loop:
            hp = builder.gep(p, [builder.mul(loop.index, ir.Constant(i64, 32))])
            f = em.half_to_float(builder.load(builder.bitcast(hp, v16h.as_pointer()), align=2))
            fp = builder.gep(q, [builder.mul(loop.index, ir.Constant(i64, 64))])
            builder.store(f, builder.bitcast(fp, v16f.as_pointer()), align=4)

    return sig, codegen


# exp(x) = 2^k e^r, k = round(x log2 e), |r| <= ln2 / 2, e^r by Cephes' expf polynomial (about
# one ulp); x clamped to [-87.3, 88.7] so that 2^k stays a normal float
_EXP_LO, _EXP_HI, _LOG2E = -87.3, 88.7, 1.4426950408889634
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_POLY = (
    1.9875691500e-4,
    1.3981999507e-3,
    8.3334519073e-3,
    4.1665795894e-2,
    1.6666665459e-1,
    5.0000001201e-1,
)


def _emit_exp(builder, x):
    """IR for exp(x) of a float or a <16 x float>, arithmetic only (no libm call), so that a
    block of scores takes 16 exponentials per few instructions where math.exp is one call each."""
    from llvmlite import ir

    ty = x.type
    vec = isinstance(ty, ir.VectorType)
    ity = ir.VectorType(ir.IntType(32), 16) if vec else ir.IntType(32)

    def c(v, t=ty):
        return ir.Constant(t, [v] * 16 if vec else v)

    def fast(ins):
        ins.flags.append("fast")
        return ins

    def mul(a, b):
        return fast(builder.fmul(a, b))

    def add(a, b):
        return fast(builder.fadd(a, b))

    floor = builder.module.declare_intrinsic(
        "llvm.floor.v16f32" if vec else "llvm.floor.f32", fnty=ir.FunctionType(ty, [ty])
    )
    x = builder.select(builder.fcmp_ordered("<", x, c(_EXP_LO)), c(_EXP_LO), x)
    x = builder.select(builder.fcmp_ordered(">", x, c(_EXP_HI)), c(_EXP_HI), x)
    k = builder.call(floor, [add(mul(x, c(_LOG2E)), c(0.5))])
    # the two-part ln 2 (Cody-Waite) only works unreassociated: no fast-math flags here
    r = builder.fsub(builder.fsub(x, builder.fmul(k, c(_LN2_HI))), builder.fmul(k, c(_LN2_LO)))
    p = c(_EXP_POLY[0])
    for coef in _EXP_POLY[1:]:
        p = add(mul(p, r), c(coef))
    p = add(add(mul(p, mul(r, r)), r), c(1.0))
    two_k = builder.bitcast(
        builder.shl(builder.add(builder.fptosi(k, ity), c(127, ity)), c(23, ity)), ty
    )
    return mul(p, two_k)


@intrinsic
def _exp_row(typingctx, sc, r, n, m):
    """sc[r, :n] = exp(sc[r, :n] - m), returning their float32 sum: a block's softmax weights
    and their total (sc a C-contiguous 2-D float32 array)."""
    sig = types.float32(sc, r, n, m)

    def codegen(context, builder, signature, args):
        from llvmlite import ir

        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        v16f = ir.VectorType(f32, 16)
        a = context.make_array(signature.args[0])(context, builder, args[0])
        rr, nn = (context.cast(builder, args[i], signature.args[i], types.int64) for i in (1, 2))
        m = context.cast(builder, args[3], signature.args[3], types.float32)
        row = builder.gep(
            builder.bitcast(a.data, ir.IntType(8).as_pointer()),
            [builder.mul(rr, cgutils.unpack_tuple(builder, a.strides)[0])],
        )
        p = builder.bitcast(row, f32.as_pointer())
        msplat = builder.shuffle_vector(
            builder.insert_element(ir.Constant(v16f, ir.Undefined), m, ir.Constant(i32, 0)),
            ir.Constant(v16f, ir.Undefined),
            ir.Constant(ir.VectorType(i32, 16), [0] * 16),
        )
        vsum = cgutils.alloca_once_value(builder, ir.Constant(v16f, [0.0] * 16))
        n16 = builder.udiv(nn, ir.Constant(i64, 16))
        with cgutils.for_range(builder, n16) as loop:
            vp = builder.bitcast(
                builder.gep(p, [builder.mul(loop.index, ir.Constant(i64, 16))]), v16f.as_pointer()
            )
            e = _emit_exp(builder, builder.fsub(builder.load(vp, align=4), msplat))
            builder.store(e, vp, align=4)
            builder.store(builder.fadd(builder.load(vsum), e), vsum)
        acc = builder.load(vsum)
        tot = cgutils.alloca_once_value(builder, ir.Constant(f32, 0.0))
        for i in range(16):
            builder.store(
                builder.fadd(builder.load(tot), builder.extract_element(acc, ir.Constant(i32, i))),
                tot,
            )
        done = builder.mul(n16, ir.Constant(i64, 16))
        with cgutils.for_range(builder, builder.sub(nn, done)) as loop:
            sp = builder.gep(p, [builder.add(done, loop.index)])
            e = _emit_exp(builder, builder.fsub(builder.load(sp), m))
            builder.store(e, sp)
            builder.store(builder.fadd(builder.load(tot), e), tot)
        return builder.load(tot)

    return sig, codegen


# The gated activations take their exponentials 16 at a time from _exp_row (float32, within
# 3 ulp, as ggml's own vectorised expf is), not one libm call each: 7 -> 1.5 us for a row of
# 1536 (SmolLM2), a fifth of a decode step's non-mat-vec time.
# exp's argument is capped where v / (1 + exp(-v)) is 0 in float32 anyway: the polynomial's
# top of range gives infinity, which fast-math division turns into NaN
_SIGMOID_EXP_MAX = np.float32(80.0)


def _swiglu_rows(g, u, out):  # (T, F)
    T, F = g.shape
    e = np.empty((1, F), np.float32)
    for t in range(T):
        for i in range(F):
            e[0, i] = min(-g[t, i], _SIGMOID_EXP_MAX)
        _exp_row(e, 0, F, np.float32(0.0))  # type: ignore[call-arg]  # @intrinsic drops typingctx
        for i in range(F):
            out[t, i] = g[t, i] / (np.float32(1.0) + e[0, i]) * u[t, i]


def _geglu_rows(g, u, out):  # tanh-approximated GELU, as ggml_gelu
    T, F = g.shape
    c = np.float32(math.sqrt(2.0 / math.pi))
    e = np.empty((1, F), np.float32)
    for t in range(T):
        # 0.5*v*(1+tanh(z)) == v*sigmoid(2z); exp is much cheaper than tanh here
        for i in range(F):
            v = g[t, i]
            e[0, i] = min(
                np.float32(-2.0) * c * (v + np.float32(0.044715) * v * v * v), _SIGMOID_EXP_MAX
            )
        _exp_row(e, 0, F, np.float32(0.0))  # type: ignore[call-arg]
        for i in range(F):
            out[t, i] = g[t, i] / (np.float32(1.0) + e[0, i]) * u[t, i]


def _swiglu_fused_rows(gu, out):  # gu (T, 2F): gate | up halves of one fused projection
    T, F = out.shape
    e = np.empty((1, F), np.float32)
    for t in range(T):
        for i in range(F):
            e[0, i] = min(-gu[t, i], _SIGMOID_EXP_MAX)
        _exp_row(e, 0, F, np.float32(0.0))  # type: ignore[call-arg]
        for i in range(F):
            out[t, i] = gu[t, i] / (np.float32(1.0) + e[0, i]) * gu[t, F + i]


_swiglu = kernel(_swiglu_rows)
_geglu = kernel(_geglu_rows)


def _softmax_rows(s, scale):  # (T, L) in place: each row becomes softmax(scale * row)
    T, L = s.shape
    for t in range(T):
        m = np.float32(-np.inf)
        for j in range(L):
            v = s[t, j] * scale
            s[t, j] = v
            m = max(m, v)
        inv = np.float32(1.0) / _exp_row(s, t, L, m)  # type: ignore[call-arg]
        for j in range(L):
            s[t, j] *= inv


_softmax = kernel(_softmax_rows)


def softmax_rows(s: np.ndarray, scale: float) -> None:
    """s (T, L) C-contiguous float32, in place: softmax(scale * s) of every row, on the calling
    thread (a vision tower's attention runs one head per worker)."""
    _softmax(s, np.float32(scale))


_swiglu_fused = kernel(_swiglu_fused_rows)


def _load_block(src, s, j0, n, g, bits, vals):
    """src[s, j0:j0+n, g, :] -> vals[:n] float32, src float32 or float16 bits (uint16)."""


@overload(_load_block, jit_options=dict(fastmath=True))
def _load_block_impl(src, s, j0, n, g, bits, vals):
    if src.dtype == types.uint16:

        def f16(src, s, j0, n, g, bits, vals):
            # bits aliases vals' memory. Branch-free so that LLVM vectorises it: move
            # exponent+mantissa into float32 position and rescale by 2^112 (exact for normals
            # and subnormals); apply the sign last.
            D = src.shape[3]
            if D % 16 == 0:  # every head size in practice: 16 halves per conversion
                for jj in range(n):
                    _f16_row(src, s, j0 + jj, g, vals, jj)  # type: ignore[call-arg]  # @intrinsic drops typingctx
                return
            for jj in range(n):
                for d in range(D):
                    bits[jj, d] = np.uint32(src[s, j0 + jj, g, d] & 0x7FFF) << 13
            for jj in range(n):
                for d in range(D):
                    sign = np.float32(1.0) - np.float32(2.0) * np.float32(
                        src[s, j0 + jj, g, d] >> 15
                    )
                    vals[jj, d] = vals[jj, d] * _TWO112 * sign

        return f16

    def f32(src, s, j0, n, g, bits, vals):
        D = src.shape[3]
        for jj in range(n):
            for d in range(D):
                vals[jj, d] = src[s, j0 + jj, g, d]

    return f32


@kernel
def _merge_splits(pm, pl, pacc, n_split, G, sinks, out):
    """out (T, H, Dv) = the merged softmax states of each head's n_split splits (see _attn_body),
    sinks joining the denominators. Its own function: a parallel kernel's code after the prange
    sharing the loop's variable names made numba's parfor slow."""
    T, H, Dv = out.shape
    rep = H // G
    for th in range(T * H):
        t = th // H
        h = th % H
        r = h % rep
        i0 = (t * G + h // rep) * n_split
        mx = _NEG
        for sp in range(n_split):
            mx = max(mx, pm[i0 + sp, r])
        if sinks.shape[0] and sinks[h] > mx:
            mx = sinks[h]
        tot = np.float32(0.0)
        for d in range(Dv):
            out[t, h, d] = 0.0
        for sp in range(n_split):
            c = np.float32(math.exp(pm[i0 + sp, r] - mx))
            tot += pl[i0 + sp, r] * c
            for d in range(Dv):
                out[t, h, d] += c * pacc[i0 + sp, r, d]
        if sinks.shape[0]:
            tot += np.float32(math.exp(sinks[h] - mx))
        inv = np.float32(1.0) / tot
        for d in range(Dv):
            out[t, h, d] *= inv


@kernel
def _attn_item(
    q,
    k,
    v,
    seq,
    base,
    pos,
    window,
    scale,
    softcap,
    n_split,
    split_len,
    bits,
    vals,
    sc,
    pm,
    pl,
    pacc,
    it,
):
    """Work item `it` of _attn_body: token t, KV head g, split sp of the token's positions.

    One pass over its keys and values, flash-attention style: each block of keys is converted
    once and scored for every head sharing g; the running max pm[it], sum pl[it] and output
    accumulator pacc[it] (rescaled when the max grows) take the block's exp-weighted values.
    bits/vals: this thread's conversion block, sc (rep, KV_BLOCK) its scores. The serial and
    parallel kernels share this one compiled body.
    """
    D = q.shape[2]
    G = k.shape[2]
    Dv = v.shape[3]
    rep = q.shape[1] // G
    sp = it % n_split
    t = it // n_split // G
    g = it // n_split % G
    s = seq[t]
    c0 = base[t]  # the cell of the sequence's position 0 in row s
    p = pos[t]
    lo = 0
    if window > 0 and p - window + 1 > 0:
        lo = p - window + 1
    a = lo + sp * split_len
    e = min(p + 1, a + split_len)
    h0 = g * rep
    for r in range(rep):
        pm[it, r] = _NEG
        pl[it, r] = 0.0
        for d in range(Dv):
            pacc[it, r, d] = 0.0
    blk = min(KV_BLOCK, BLOCK_FLOATS // max(D, Dv))
    for j0 in range(a, e, blk):
        n = min(blk, e - j0)
        _load_block(k, s, c0 + j0, n, g, bits, vals)
        for r in range(rep):
            bm = _NEG
            for jj in range(n):
                acc = np.float32(0.0)
                for d in range(D):
                    acc += q[t, h0 + r, d] * vals[jj, d]
                acc *= scale
                if softcap > 0.0:
                    acc = softcap * np.float32(math.tanh(acc / softcap))
                sc[r, jj] = acc
                bm = max(bm, acc)
            m_old = pm[it, r]
            m_new = max(m_old, bm)
            c = np.float32(math.exp(m_old - m_new))
            pl[it, r] = pl[it, r] * c + _exp_row(sc, r, n, m_new)  # type: ignore[call-arg]
            pm[it, r] = m_new
            if m_new > m_old:
                for d in range(Dv):
                    pacc[it, r, d] *= c
        _load_block(v, s, c0 + j0, n, g, bits, vals)
        for r in range(rep):
            for jj in range(n):
                w = sc[r, jj]
                for d in range(Dv):
                    pacc[it, r, d] += w * vals[jj, d]


def _attn_body(
    q,
    k,
    v,
    seq,
    base,
    pos,
    window,
    scale,
    softcap,
    sinks,
    out,
    n_split,
    split_len,
    kbits,
    kvals,
    sbuf,
    pm,
    pl,
    pacc,
):
    # q (T, H, D); k (S, C, G, D), v (S, C, G, Dv) float32 or float16 bits; out (T, H, Dv).
    # Token t's position j is cell base[t] + j of row seq[t].
    # Work items (token, KV head, split) in parallel, each split covering split_len positions
    # of its token's range; their partial softmax states merge at the end (with the sinks).
    # kbits/kvals (n_threads, KV_BLOCK, max(D, Dv)), sbuf (n_threads, rep, KV_BLOCK): per
    # thread scratch; pm, pl (T*G*n_split, rep), pacc (T*G*n_split, rep, Dv).
    T, G = q.shape[0], k.shape[2]
    for it in prange(T * G * n_split):
        tid = numba.get_thread_id()
        _attn_item(
            q,
            k,
            v,
            seq,
            base,
            pos,
            window,
            scale,
            softcap,
            n_split,
            split_len,
            kbits[tid],
            kvals[tid],
            sbuf[tid],
            pm,
            pl,
            pacc,
            it,
        )
    _merge_splits(pm, pl, pacc, n_split, G, sinks, out)


_attn_s, _attn_p = serial_and_parallel(_attn_body)
# Below this many multiply-adds a parallel region's thread wake-up costs more than it saves
# (measured on SmolLM2's shape, 2 threads: parallel from ~60 positions on; at 256 positions
# 43 -> 29 us a layer, at 512 78 -> 50).
ATTN_PARALLEL_MIN_WORK = 1 << 16
# A split (parallel path) covers at least this many positions: each has a merge to pay for.
SPLIT_MIN = 64
# Work items per thread the splits aim at (the prange is statically scheduled: more items
# even out the remainder).
ITEMS_PER_THREAD = 4

_scratch: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _block_scratch(d: int, rep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-thread (KV_BLOCK, d) conversion blocks, as uint32 and float32 views of one buffer,
    and (rep, KV_BLOCK) score blocks (allocated once per shape; 17 KiB a thread for d = 64)."""
    key = (d, rep)
    if key not in _scratch:
        # the kernels read numba.get_thread_id(), which needs the threading layer started: a
        # freshly compiled kernel starts it, one loaded from the cache does not (a crash when
        # attention was a process's first kernel)
        _launch_threads()
        n = numba.config.NUMBA_NUM_THREADS
        buf = np.zeros((n, KV_BLOCK, d), np.float32)
        _scratch[key] = (buf.view(np.uint32), buf, np.zeros((n, rep, KV_BLOCK), np.float32))
    return _scratch[key]


_NO_SINKS = np.zeros(0, np.float32)


class AttentionPlan:
    """How one attention-kernel call over T tokens whose furthest position is n_pos - 1 runs:
    serial or parallel, its splits, and its scratch (the arguments after `out`)."""

    __slots__ = ("parallel", "n_split", "split_len", "kbits", "kvals", "sbuf", "pm", "pl", "pacc")

    def __init__(self, T: int, H: int, G: int, D: int, Dv: int, n_pos: int, window: int):
        if window > 0:
            n_pos = min(n_pos, window)
        big = T * H * n_pos * (D + Dv) >= ATTN_PARALLEL_MIN_WORK
        n_split = 1
        if big:  # split long contexts so that every thread has work even with few KV heads
            want = -(-ITEMS_PER_THREAD * numba.get_num_threads() // (T * G))
            n_split = max(1, min(want, n_pos // SPLIT_MIN))
        split_len = -(-n_pos // n_split)
        split_len = -(-split_len // KV_BLOCK) * KV_BLOCK
        n_split = -(-n_pos // split_len)
        self.parallel, self.n_split, self.split_len = big, n_split, split_len
        self.kbits, self.kvals, self.sbuf = _block_scratch(max(D, Dv), H // G)
        n_items = T * G * n_split
        self.pm = np.empty((n_items, H // G), np.float32)
        self.pl = np.empty((n_items, H // G), np.float32)
        self.pacc = np.empty((n_items, H // G, Dv), np.float32)

    def args(self) -> tuple:
        return (
            self.n_split,
            self.split_len,
            self.kbits,
            self.kvals,
            self.sbuf,
            self.pm,
            self.pl,
            self.pacc,
        )


def attention_tokens(
    q,
    k,
    v,
    seq,
    pos,
    window,
    scale,
    softcap,
    out,
    sinks: np.ndarray | None = None,
    base: np.ndarray | None = None,
) -> None:
    """Per-token attention over the cache (decode path): each token attends to its own
    sequence's positions [max(0, pos-window+1), pos], position j of token t at k[seq[t],
    base[t] + j] (base None: at cell j; a unified cache's sequences start at their run's first
    cell, so one call serves the decode tokens of every sequence). k/v: float32 or float16
    bits (uint16).
    Scores are q.k * scale, then softcap * tanh(score / softcap) when softcap > 0. sinks
    (n_head,) float32: head h's softmax denominator also holds exp(sinks[h]) (ggml_soft_max_ext
    with sinks), so its weights may sum to less than one."""
    sk = _NO_SINKS if sinks is None else sinks
    T, H, D = q.shape
    plan = AttentionPlan(T, H, k.shape[2], D, v.shape[3], int(pos.max()) + 1, window)
    fn = _attn_p if plan.parallel else _attn_s
    cells0 = np.zeros(T, np.int64) if base is None else base
    fn(
        q,
        k,
        v,
        seq,
        cells0,
        pos,
        window,
        np.float32(scale),
        np.float32(softcap),
        sk,
        out,
        *plan.args(),
    )


@kernel
def f32_to_f16_bits(f):
    """The float16 bits (uint16) of the float32 with bits f (uint32), rounded to nearest even as
    numpy's astype(float16) does: overflow to infinity, subnormal halves, NaN kept a NaN."""
    sign = (f >> np.uint32(16)) & np.uint32(0x8000)
    e = f & np.uint32(0x7F800000)
    if e >= np.uint32(0x47800000):  # |f| >= 65536, infinity or NaN
        if e == np.uint32(0x7F800000) and (f & np.uint32(0x007FFFFF)) != 0:
            m = np.uint32(0x7C00) + ((f & np.uint32(0x007FFFFF)) >> np.uint32(13))
            return np.uint16(sign | (m if m != np.uint32(0x7C00) else np.uint32(0x7E00)))
        return np.uint16(sign | np.uint32(0x7C00))
    if e <= np.uint32(0x38000000):  # below the smallest normal half: subnormal or zero
        if e < np.uint32(0x33000000):
            return np.uint16(sign)
        m = (np.uint32(0x00800000) | (f & np.uint32(0x007FFFFF))) >> (
            np.uint32(113) - (e >> np.uint32(23))
        )
        # ties to even; the bits the shift dropped count as "more than half" when non-zero
        if (m & np.uint32(0x3FFF)) != np.uint32(0x1000) or (f & np.uint32(0x7FF)) != 0:
            m += np.uint32(0x1000)
        return np.uint16(sign | (m >> np.uint32(13)))
    m = f & np.uint32(0x007FFFFF)
    if (m & np.uint32(0x3FFF)) != np.uint32(0x1000):
        m += np.uint32(0x1000)
    # a carry out of the mantissa lands in the exponent, as it should (up to infinity)
    return np.uint16(sign | (((e - np.uint32(0x38000000)) >> np.uint32(13)) + (m >> np.uint32(13))))


@kernel
def store_kv_f16(dst, st, cell, src):
    """dst[st, cell] = src (G * D,) float32 as float16 bits; dst (S, C, G, D) uint16."""
    G, D = dst.shape[2], dst.shape[3]
    bits = src.view(np.uint32)
    for g in range(G):
        for d in range(D):
            dst[st, cell, g, d] = f32_to_f16_bits(bits[g * D + d])


@kernel
def store_kv_f32(dst, st, cell, src):
    """dst[st, cell] = src (G * D,) float32; dst (S, C, G, D) float32."""
    G, D = dst.shape[2], dst.shape[3]
    for g in range(G):
        for d in range(D):
            dst[st, cell, g, d] = src[g * D + d]


def attention_chunk(
    q,
    kf,
    vf,
    pos,
    window,
    scale,
    softcap,
    out,
    sinks: np.ndarray | None = None,
    k0: int = 0,
    vis: np.ndarray | None = None,
) -> None:
    """Batch attention for one sequence's chunk with numpy BLAS (prefill path).

    q (m, H, D) queries at positions pos (m,); kf (L, G, D) and vf (L, G, Dv) float32 keys and
    values for positions k0..k0+L-1 of that sequence (every position a query sees); out
    (m, H, Dv). softcap and sinks as attention_tokens. vis (m,): the last key position each
    query sees when that is after its own (an image span's tokens see each other); the
    sliding window still counts back from the query's own position.
    """
    m, H, D = q.shape
    L, G, _ = kf.shape
    rep = H // G
    kpos = k0 + np.arange(L)
    mask = kpos[None, :] > (pos if vis is None else vis)[:, None]  # (m, L) causal
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
