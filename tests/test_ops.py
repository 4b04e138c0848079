"""engine/ops.py kernels against float64 numpy references: attention with and without sinks
(per-token f32 and f16-cache paths, the batch path), and the swiglu_oai activation."""

from __future__ import annotations

import numpy as np
import pytest

from engine import ops

H, G, D, DV = 4, 2, 8, 8


def _ref_attention(q, k, v, pos, window, scale, softcap, sinks):
    """q (T, H, D) at positions pos; k (L, G, D), v (L, G, Dv) of one sequence; float64."""
    T = q.shape[0]
    rep = H // G
    out = np.zeros((T, H, v.shape[2]))
    for t in range(T):
        p = int(pos[t])
        lo = max(0, p - window + 1) if window else 0
        for h in range(H):
            s = k[lo : p + 1, h // rep].astype(np.float64) @ q[t, h].astype(np.float64) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            mx = max(s.max(), sinks[h]) if sinks is not None else s.max()
            e = np.exp(s - mx)
            tot = e.sum() + (np.exp(sinks[h] - mx) if sinks is not None else 0.0)
            out[t, h] = (e / tot) @ v[lo : p + 1, h // rep]
    return out


def _inputs(L=40, seed=0):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((L, G, D)).astype(np.float32)
    v = rng.standard_normal((L, G, DV)).astype(np.float32)
    q = rng.standard_normal((L, H, D)).astype(np.float32)
    # one large sink (dominates), one small, one near the scores, one absent in effect
    sinks = np.array([4.0, -3.0, 0.5, -30.0], np.float32)
    return q, k, v, sinks


CASES = [(0, 0.0), (7, 0.0), (0, 5.0)]  # (window, softcap)


@pytest.mark.parametrize("window,softcap", CASES)
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("f16", [False, True])
def test_attention_tokens_matches_reference(window, softcap, with_sinks, f16):
    q, k, v, sinks = _inputs()
    sinks = sinks if with_sinks else None
    pos = np.array([0, 5, 20, 39], np.int32)
    qt = np.ascontiguousarray(q[pos])
    # a cache of 2 sequences; the tokens read sequence 1
    kc = np.zeros((2, 64, G, D), np.float32)
    vc = np.zeros((2, 64, G, DV), np.float32)
    kc[1, :40], vc[1, :40] = k, v
    if f16:
        k, v = (
            kc[1, :40].astype(np.float16).astype(np.float32),
            vc[1, :40].astype(np.float16).astype(np.float32),
        )
        kc, vc = kc.astype(np.float16).view(np.uint16), vc.astype(np.float16).view(np.uint16)
    out = np.empty((4, H, DV), np.float32)
    ops.attention_tokens(qt, kc, vc, np.ones(4, np.int32), pos, window, 0.3, softcap, out, sinks)
    want = _ref_attention(qt, k, v, pos, window, 0.3, softcap, sinks)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("window,softcap", CASES)
@pytest.mark.parametrize("with_sinks", [False, True])
def test_attention_chunk_matches_reference(window, softcap, with_sinks):
    q, k, v, sinks = _inputs()
    sinks = sinks if with_sinks else None
    pos = np.arange(10, 40, dtype=np.int32)
    out = np.empty((30, H, DV), np.float32)
    ops.attention_chunk(q[10:], k, v, pos, window, 0.3, softcap, out, sinks)
    want = _ref_attention(q[10:], k, v, pos, window, 0.3, softcap, sinks)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_sinks_change_the_output():
    """A large sink takes most of the softmax mass: the output shrinks towards zero."""
    q, k, v, sinks = _inputs()
    pos = np.arange(40, dtype=np.int32)
    a, b = np.empty((40, H, DV), np.float32), np.empty((40, H, DV), np.float32)
    ops.attention_chunk(q, k, v, pos, 0, 0.3, 0.0, a)
    ops.attention_chunk(q, k, v, pos, 0, 0.3, 0.0, b, sinks)
    assert np.abs(b[:, 0]).max() < 0.5 * np.abs(a[:, 0]).max()  # head 0: sink 4.0
    np.testing.assert_allclose(b[:, 3], a[:, 3], rtol=1e-5, atol=1e-6)  # head 3: sink -30


def _ref_swiglu_oai(g, u, alpha=1.702, limit=7.0):
    x = np.minimum(g.astype(np.float64), limit)
    y = np.clip(u.astype(np.float64), -limit, limit)
    return x / (1.0 + np.exp(-alpha * x)) * (y + 1.0)


@pytest.mark.parametrize("rows", [1, 3, 20])  # serial and row-split paths
def test_swiglu_oai_matches_reference(rows):
    rng = np.random.default_rng(1)
    g = (rng.standard_normal((rows, 50)) * 6).astype(np.float32)  # many beyond +-7
    u = (rng.standard_normal((rows, 50)) * 6).astype(np.float32)
    out = np.empty_like(g)
    ops.swiglu_oai(g, u, out)
    np.testing.assert_allclose(out, _ref_swiglu_oai(g, u), rtol=1e-5, atol=1e-5)
    ops.swiglu_oai(g, u, g)  # in place over the gate
    np.testing.assert_allclose(g, out)


def test_swiglu_oai_clamps():
    g = np.array([[10.0, -10.0, 1.0, 1.0]], np.float32)
    u = np.array([[0.0, 0.0, 20.0, -20.0]], np.float32)
    out = np.empty_like(g)
    ops.swiglu_oai(g, u, out)
    sig = lambda x: x / (1 + np.exp(-1.702 * x))
    np.testing.assert_allclose(
        out[0], [sig(7.0), sig(-10.0), sig(1.0) * 8.0, sig(1.0) * -6.0], rtol=1e-6
    )
