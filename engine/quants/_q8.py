"""The activation quantisers of the int8 mat-vec: x -> llama.cpp's Q8_0, Q8_1 or Q8_K blocks.

llama.cpp multiplies a quantised weight by an activation quantised once per mat-vec into the
weight type's `vec_dot_type` (ggml-cpu.c type_traits_cpu): Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4,
Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants and IQ4_XS. These transcribe its x86 quantisers
(ggml-cpu/arch/x86/quants.c: quantize_row_q8_0/q8_1 with AVX, quantize_row_q8_K_ref), rounding
included: scale 127 / amax, round half to even, the block scale (and Q8_1's s) stored as f16
(F16C's round to nearest even) for Q8_0/Q8_1, as f32 for Q8_K.

Each takes x (T, n) float32 and returns (xq, xd, xs): xq (T, n) int8 codes, xd (T, n // block)
float32 block scales, xs float32 per-block extras: Q8_1's s = d * sum(codes) (T, n // 32),
Q8_K's bsums (sums of 16 codes, exact as floats) (T, n // 16), nothing for Q8_0 (T, 1).
They run without fast-math (jit.exact_kernel) so that every rounding is the C one.
"""

from __future__ import annotations

import math

import numpy as np

from .. import jit


@jit.exact_kernel
def f16_round(v):
    """float32 v rounded to the nearest IEEE half (ties to even), as float32 (vcvtps2ph)."""
    a = abs(np.float64(v))
    if a == 0.0 or not math.isfinite(a):
        return np.float32(v)
    if a >= 65520.0:  # rounds past the largest half (65504)
        return np.float32(math.copysign(math.inf, v))
    m, e = math.frexp(a)  # a = m * 2^e, 0.5 <= m < 1
    if e - 1 >= -14:  # a normal half: 11 significant bits
        r = math.ldexp(np.rint(math.ldexp(m, 11)), e - 11)
    else:  # a subnormal half: a multiple of 2^-24
        r = np.rint(a * 16777216.0) / 16777216.0
    return np.float32(math.copysign(r, v))


@jit.exact_kernel
def _q8_blocks(x, with_s):
    n_tok, n = x.shape
    nb = n // 32
    xq = np.empty((n_tok, n), np.int8)
    xd = np.empty((n_tok, nb), np.float32)
    xs = np.zeros((n_tok, nb if with_s else 1), np.float32)
    c127 = np.float32(127.0)
    for t in range(n_tok):
        for b in range(nb):
            amax = np.float32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[t, 32 * b + j]))
            d = amax / c127
            xd[t, b] = f16_round(d)
            inv = c127 / amax if amax != 0 else np.float32(0.0)
            isum = 0
            for j in range(32):
                q = int(np.rint(x[t, 32 * b + j] * inv))
                xq[t, 32 * b + j] = q
                isum += q
            if with_s:
                xs[t, b] = f16_round(d * np.float32(isum))
    return xq, xd, xs


@jit.exact_kernel
def quantize_q8_0(x):
    """x (T, n) -> Q8_0 blocks of 32 as (codes, f16-rounded scales, dummy)."""
    return _q8_blocks(x, False)


@jit.exact_kernel
def quantize_q8_1(x):
    """x (T, n) -> Q8_1 blocks of 32 as (codes, f16-rounded scales d, f16-rounded s = d * sum)."""
    return _q8_blocks(x, True)


@jit.exact_kernel
def quantize_q8_k(x):
    """x (T, n) -> Q8_K super-blocks of 256 as (codes, f32 scales, bsums of 16 codes)."""
    n_tok, n = x.shape
    nb = n // 256
    xq = np.zeros((n_tok, n), np.int8)
    xd = np.zeros((n_tok, nb), np.float32)
    xs = np.zeros((n_tok, n // 16), np.float32)
    for t in range(n_tok):
        for b in range(nb):
            amax = np.float32(0.0)
            vmax = np.float32(0.0)
            for j in range(256):  # the first element of largest magnitude, with its sign
                ax = abs(x[t, 256 * b + j])
                if ax > amax:
                    amax = ax
                    vmax = x[t, 256 * b + j]
            if amax == 0:
                continue
            iscale = np.float32(-127.0) / vmax
            for g in range(16):
                s = 0
                for j in range(16):
                    i = 256 * b + 16 * g + j
                    q = min(127, int(np.rint(iscale * x[t, i])))
                    xq[t, i] = q
                    s += q
                xs[t, 16 * b + g] = s
            xd[t, b] = np.float32(1.0) / iscale
    return xq, xd, xs


@jit.exact_kernel
def quantize_planes(x, block):
    """x (T, n) -> two 8-bit planes a token, for the default decode path's integer dots:
    x ~= d_hi * q_hi + d_lo * q_lo per block of `block` (32, or 256 for the Q8_K types), q_hi
    x's codes at scale amax / 127, q_lo those of what they leave (x - d_hi * q_hi) at its own
    amax / 127: ~15 bits of x instead of 8, and a rounding that flips moves x by at most
    d_lo / 2 (an 8-bit grid's flip moves it by d_hi). Returns (codes, scales, s) with token t's
    planes in rows 2t and 2t + 1, as make_group_dot_i8(planes=2) reads them: codes (2T, n)
    int8, scales (2T, n // block) float32 (not rounded to f16: no format to match), s (2T,
    n // block) = d * sum(codes) (the m * s term of Q4_1 / Q5_1)."""
    n_tok, n = x.shape
    nb = n // block
    xq = np.zeros((2 * n_tok, n), np.int8)
    xd = np.zeros((2 * n_tok, nb), np.float32)
    xs = np.zeros((2 * n_tok, nb), np.float32)
    c127 = np.float32(127.0)
    r = np.empty(block, np.float32)
    for t in range(n_tok):
        for b in range(nb):
            for j in range(block):
                r[j] = x[t, block * b + j]
            for p in range(2):
                amax = np.float32(0.0)
                for j in range(block):
                    amax = max(amax, abs(r[j]))
                if not amax > 0:  # all zero (or NaN: the scale carries it)
                    xd[2 * t + p, b] = amax
                    continue
                d = amax / c127
                inv = c127 / amax
                isum = 0
                for j in range(block):
                    q = int(np.rint(r[j] * inv))
                    xq[2 * t + p, block * b + j] = q
                    isum += q
                    r[j] = r[j] - d * np.float32(q)
                xd[2 * t + p, b] = d
                xs[2 * t + p, b] = d * np.float32(isum)
    return xq, xd, xs
