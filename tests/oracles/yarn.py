"""YaRN RoPE in float64, transcribed from llama.cpp: llama_context's yarn_attn_factor
(src/llama-context.cpp) and ggml-cpu's rope_yarn / ggml_rope_cache_init with
ggml_rope_yarn_corr_dims (ggml/src/ggml.c). Independent of the engine."""

from __future__ import annotations

import math

import numpy as np


def corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float):
    def dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(dim(beta_fast))), min(n_dims - 1.0, math.ceil(dim(beta_slow)))


def context_attn_factor(
    freq_scale: float, ext_factor: float, rope_attn_factor: float = 1.0, log_mul: float = 0.0
) -> float:
    """cparams.yarn_attn_factor as llama_context computes it."""
    attn = 1.0
    if ext_factor != 0:

        def get_mscale(scale, mscale):
            return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0

        factor = 1.0 / freq_scale
        attn = (
            get_mscale(factor, 1.0) / get_mscale(factor, log_mul)
            if log_mul
            else get_mscale(factor, 1.0)
        )
        attn *= 1.0 / (1.0 + 0.1 * math.log(factor))
    return attn * rope_attn_factor


def cos_sin(
    pos: np.ndarray,
    n_dims: int,
    base: float,
    freq_scale: float,
    ext_factor: float,
    attn_factor: float,
    beta_fast: float,
    beta_slow: float,
    n_ctx_orig: int,
    freq_factors=None,
):
    """ggml_rope_cache_init: (T, n_dims/2) cos and sin of each position and rotated pair."""
    lo, hi = corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow)
    theta_scale = base ** (-2.0 / n_dims)
    T, half = len(pos), n_dims // 2
    c, s = np.zeros((T, half)), np.zeros((T, half))
    for t in range(T):
        theta = float(pos[t])
        for i0 in range(0, n_dims, 2):
            ff = freq_factors[i0 // 2] if freq_factors is not None else 1.0
            theta_extrap = theta / ff
            theta_interp = freq_scale * theta_extrap
            th, mscale = theta_interp, attn_factor
            if ext_factor != 0.0:
                y = (i0 // 2 - lo) / max(0.001, hi - lo)
                ramp_mix = (1 - min(1.0, max(0.0, y))) * ext_factor
                th = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
                mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
            c[t, i0 // 2], s[t, i0 // 2] = math.cos(th) * mscale, math.sin(th) * mscale
            theta *= theta_scale
    return c, s


def rope(x: np.ndarray, pos: np.ndarray, n_dims: int, neox: bool, **kw) -> np.ndarray:
    """ggml_rope_ext of x (T, heads, D): NEOX pairs (i, i + n_dims/2), NORM pairs (2i, 2i+1);
    kw are cos_sin's parameters after n_dims."""
    c, s = cos_sin(pos, n_dims, **kw)
    x = x.astype(np.float64).copy()
    half = n_dims // 2
    i0 = np.arange(half) if neox else 2 * np.arange(half)
    i1 = i0 + half if neox else i0 + 1
    a, b = x[:, :, i0].copy(), x[:, :, i1].copy()
    x[:, :, i0] = a * c[:, None] - b * s[:, None]
    x[:, :, i1] = a * s[:, None] + b * c[:, None]
    return x
