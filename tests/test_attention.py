"""The fused decode attention kernel (ops.attention_tokens) against a float64 numpy reference
and the BLAS chunk path: long contexts split over threads, grouped-query heads, value heads
wider than key heads, float16 and float32 caches, windows, soft-capping and sinks."""

from __future__ import annotations

import numpy as np
import pytest

from engine import ops


def _ref(q, k, v, pos, window, scale, softcap, sinks):
    """q (T, H, D) at positions pos; k (L, G, D), v (L, G, Dv) of one sequence; float64."""
    T, H, _ = q.shape
    rep = H // k.shape[1]
    out = np.zeros((T, H, v.shape[2]))
    for t in range(T):
        p = int(pos[t])
        lo = max(0, p - window + 1) if window else 0
        for h in range(H):
            g = h // rep
            s = k[lo : p + 1, g].astype(np.float64) @ q[t, h].astype(np.float64) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            mx = max(s.max(), sinks[h]) if sinks is not None else s.max()
            e = np.exp(s - mx)
            tot = e.sum() + (np.exp(float(sinks[h]) - mx) if sinks is not None else 0.0)
            out[t, h] = (e / tot) @ v[lo : p + 1, g].astype(np.float64)
    return out


def _case(H, G, D, Dv, L, n_seq=2, seed=0):
    rng = np.random.default_rng(seed)
    kc = (rng.standard_normal((n_seq, L, G, D)) * 1.5).astype(np.float32)
    vc = rng.standard_normal((n_seq, L, G, Dv)).astype(np.float32)
    sinks = rng.uniform(-2, 3, H).astype(np.float32)
    return kc, vc, sinks


def _run(kc, vc, q, seq, pos, window, scale, softcap, sinks, f16):
    if f16:
        kc, vc = kc.astype(np.float16), vc.astype(np.float16)
        kr, vr = kc.astype(np.float32), vc.astype(np.float32)
        kc, vc = kc.view(np.uint16), vc.view(np.uint16)
    else:
        kr, vr = kc, vc
    out = np.full((q.shape[0], q.shape[1], vc.shape[3]), np.nan, np.float32)
    ops.attention_tokens(q, kc, vc, seq, pos, window, scale, softcap, out, sinks)
    want = np.stack(
        [
            _ref(
                q[t : t + 1], kr[seq[t]], vr[seq[t]], pos[t : t + 1], window, scale, softcap, sinks
            )[0]
            for t in range(q.shape[0])
        ]
    )
    return out, want


# (4, 2, 40, 24): head sizes that are not a multiple of 16 halves (the scalar conversion)
@pytest.mark.parametrize(
    "H,G,D,Dv", [(9, 3, 64, 64), (4, 1, 256, 256), (8, 8, 32, 32), (6, 2, 48, 32), (4, 2, 40, 24)]
)
@pytest.mark.parametrize("f16", [True, False])
@pytest.mark.parametrize(
    "window,softcap,with_sinks", [(0, 0.0, False), (300, 0.0, True), (0, 30.0, True)]
)
def test_long_context_split_matches_reference(H, G, D, Dv, f16, window, softcap, with_sinks):
    """Contexts long enough for the parallel path and its splits (positions 1..1100)."""
    L = 1100
    kc, vc, sinks = _case(H, G, D, Dv, L)
    rng = np.random.default_rng(1)
    pos = np.array([L - 1, 700, 1, 257, 1023], np.int32)
    seq = np.array([1, 0, 1, 0, 0], np.int32)
    q = rng.standard_normal((len(pos), H, D)).astype(np.float32)
    out, want = _run(
        kc, vc, q, seq, pos, window, D**-0.5, softcap, sinks if with_sinks else None, f16
    )
    np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5)


def test_single_decode_token_is_split_over_threads(monkeypatch):
    """One token, one KV head, 4096 positions: several splits, merged exactly."""
    calls = []
    real = ops._attn_p

    def spy(*a):
        calls.append(a[11])  # n_split
        return real(*a)

    monkeypatch.setattr(ops, "_attn_p", spy)
    kc, vc, sinks = _case(4, 1, 64, 64, 4096, n_seq=1)
    q = np.random.default_rng(2).standard_normal((1, 4, 64)).astype(np.float32) * 3
    out, want = _run(
        kc, vc, q, np.zeros(1, np.int32), np.array([4095], np.int32), 0, 0.125, 0.0, sinks, True
    )
    assert calls and calls[0] > 1
    np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5)


def test_large_scores_do_not_overflow():
    """Scores in the hundreds, growing along the context: the running max must rescale."""
    L, H, G, D = 600, 2, 1, 16
    k = np.linspace(0.1, 8.0, L, dtype=np.float32)[:, None, None] * np.ones((1, G, D), np.float32)
    v = np.random.default_rng(3).standard_normal((1, L, G, D)).astype(np.float32)
    q = np.full((1, H, D), 2.0, np.float32)
    out, want = _run(
        k[None], v, q, np.zeros(1, np.int32), np.array([L - 1], np.int32), 0, 1.0, 0.0, None, False
    )
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (100, 0.0), (0, 20.0)])
def test_agrees_with_chunk_path(window, softcap):
    """The decode kernel and the BLAS prefill path give the same attention."""
    H, G, D, L = 8, 2, 32, 400
    kc, vc, sinks = _case(H, G, D, D, L, n_seq=1)
    rng = np.random.default_rng(4)
    pos = np.arange(L - 12, L, dtype=np.int32)
    q = rng.standard_normal((12, H, D)).astype(np.float32)
    a = np.empty((12, H, D), np.float32)
    b = np.empty((12, H, D), np.float32)
    ops.attention_tokens(q, kc, vc, np.zeros(12, np.int32), pos, window, 0.2, softcap, a, sinks)
    ops.attention_chunk(q, kc[0], vc[0], pos, window, 0.2, softcap, b, sinks)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("L", [40, 1100])  # the serial kernel, the parallel one with splits
@pytest.mark.parametrize("f16", [True, False])
def test_tokens_of_several_sequences_in_one_pool(L, f16):
    """A unified cache's layout: one row, each sequence a run of cells from its own base; one
    call serves the decode tokens of every sequence, as separate per-sequence rows would."""
    H, G, D = 9, 3, 32
    kc, vc, sinks = _case(H, G, D, D, L, n_seq=3, seed=4)
    bases = np.array([7, L + 20, 2 * L + 45], np.int64)  # runs with gaps between them
    pool_k = np.zeros((1, 3 * L + 80, G, D), np.float32)
    pool_v = np.zeros((1, 3 * L + 80, G, D), np.float32)
    for s, b in enumerate(bases):
        pool_k[0, b : b + L], pool_v[0, b : b + L] = kc[s], vc[s]
    if f16:
        kc, vc = kc.astype(np.float16).view(np.uint16), vc.astype(np.float16).view(np.uint16)
        pool_k, pool_v = (
            pool_k.astype(np.float16).view(np.uint16),
            pool_v.astype(np.float16).view(np.uint16),
        )
    rng = np.random.default_rng(5)
    seq = np.array([2, 0, 1, 0], np.int32)
    pos = np.array([L - 1, L // 2, L - 3, L - 1], np.int32)
    q = rng.standard_normal((4, H, D)).astype(np.float32)
    want = np.empty((4, H, D), np.float32)
    ops.attention_tokens(q, kc, vc, seq, pos, 0, 0.2, 0.0, want, sinks)  # a row per sequence
    got = np.full((4, H, D), np.nan, np.float32)
    ops.attention_tokens(
        q, pool_k, pool_v, np.zeros(4, np.int32), pos, 0, 0.2, 0.0, got, sinks, bases[seq]
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n", [1, 15, 16, 37, 64])  # the 16-wide steps and the scalar tail
def test_block_exponentials_are_within_three_ulp(n):
    """The scores' exponentials (ops._exp_row, arithmetic instead of libm's expf) and their sum."""
    import numba

    @numba.njit
    def exp_row(sc, r, n, m):
        return ops._exp_row(sc, r, n, m)

    rng = np.random.default_rng(n)
    sc = np.zeros((2, 64), np.float32)
    sc[1, :n] = rng.uniform(-90, 0, n).astype(np.float32)
    sc[1, : min(n, 3)] = (0.0, -1e-6, -1e30)[
        : min(n, 3)
    ]  # the max itself, a near tie, "minus infinity"
    want = np.exp(
        (sc[1, :n] - np.float32(0.25)).astype(np.float64)
    )  # the difference rounds in float32 too
    total = exp_row(sc, 1, n, np.float32(0.25))
    got = sc[1, :n].astype(np.float64)
    tiny = want < 1.2e-38  # clamped to the smallest normal float instead of 0: no weight at all
    assert np.all(got[tiny] <= 1.3e-38)
    np.testing.assert_allclose(got[~tiny], want[~tiny], rtol=3.6e-7)
    assert total == pytest.approx(want.sum(), rel=1e-6)
    assert not sc[0].any() and not sc[1, n:].any()  # nothing outside row 1's first n


_EXP_ON_TARGET = """
import numba, numpy as np
from engine import ops
@numba.njit
def exp_row(sc, r, n, m):
    return ops._exp_row(sc, r, n, m)
x = np.linspace(-87, 0, 64 * 500).astype(np.float32).reshape(500, 64)
y = x.copy()
for r in range(500):
    exp_row(y, r, 64, np.float32(0))
print(float(np.max(np.abs(y - np.exp(x.astype(np.float64))) / np.exp(x.astype(np.float64)))))
"""


def test_block_exponentials_on_the_x86_64_baseline(tmp_path):
    """Compiled for the x86-64 baseline (SSE2, no FMA) the exponentials stay within 3 ulp: fast-
    math flags on the range reduction let LLVM fold the two-part ln 2 there (25 ulp)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(tmp_path),
        "NUMBA_CPU_NAME": "x86-64",
        "NUMBA_CPU_FEATURES": "+64bit,+sse,+sse2,+cx8,+fxsr,+mmx",
    }
    out = subprocess.run(
        [sys.executable, "-c", _EXP_ON_TARGET],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.split()[-1]) < 3.6e-7
