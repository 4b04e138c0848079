"""Every OpenGL shader against the CPU kernels or numpy, on whatever GL 4.3 device EGL gives
(Mesa's llvmpipe in CI); skipped when no context can be made."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q

from engine import ops
from engine.backends.gl import shaders
from engine.backends.gl.device import n_groups
from engine.backends.gl.offload import GpuTensor, matmul_gl
from gl_helpers import gl_device, run_on_scratch

RNG = np.random.default_rng(7)


def random_blocks(qtype: Q, n_rows: int, n_cols: int) -> np.ndarray:
    """(n_rows, row_bytes) packed rows: gguf's quantiser for the legacy types; for K-quants
    random bytes with small finite f16 scale fields (gguf cannot quantise them)."""
    if qtype in (Q.F32, Q.F16):
        data = RNG.standard_normal((n_rows, n_cols)).astype(np.float32)
        return (
            data.astype(np.float16 if qtype == Q.F16 else np.float32)
            .view(np.uint8)
            .reshape(n_rows, -1)
        )
    if qtype not in (Q.Q4_K, Q.Q6_K):
        data = RNG.standard_normal((n_rows, n_cols)).astype(np.float32)
        return quants.quantize(data, qtype)
    bs, ts = GGML_QUANT_SIZES[qtype]
    raw = RNG.integers(0, 256, (n_rows, n_cols // bs, ts), dtype=np.uint8)
    scale = RNG.uniform(0.001, 0.02, (n_rows, n_cols // bs)).astype(np.float16).view(np.uint8)
    if qtype == Q.Q4_K:  # d, dmin at bytes 0..3
        raw[..., 0:2] = scale.reshape(n_rows, -1, 2)
        raw[..., 2:4] = scale.reshape(n_rows, -1, 2)
    else:  # d at bytes 208..209
        raw[..., 208:210] = scale.reshape(n_rows, -1, 2)
    return raw.reshape(n_rows, -1)


def gl_matmul(
    dev,
    qtype: Q,
    raw: np.ndarray,
    n_cols: int,
    x: np.ndarray,
    acc: np.ndarray | None = None,
    cooperative: bool = False,
):
    n_rows, T = raw.shape[0], x.shape[0]
    out = np.zeros((T, n_rows), np.float32) if acc is None else acc.copy()

    def fn(sc, offs, w):
        saved, dev.cooperative = dev.cooperative, cooperative
        try:
            matmul_gl(
                dev,
                GpuTensor(w, qtype, n_rows, n_cols, raw.shape[1]),
                T,
                sc,
                offs[0],
                n_cols,
                offs[1],
                n_rows,
                acc is not None,
            )
        finally:
            dev.cooperative = saved

    w = dev.ctx.call(dev.alloc, raw.nbytes + 4, "weights", np.ascontiguousarray(raw))
    try:
        return run_on_scratch(dev, [x, out], fn, (w,))[1]
    finally:
        dev.ctx.call(dev.free, w)


@pytest.mark.parametrize(
    "qtype", sorted(shaders.MATMUL_TYPES, key=lambda q: q.name), ids=lambda q: q.name
)
@pytest.mark.parametrize("T", [1, 3, 4, 11])  # 1-3: a token per pass; 4, 11 = 4+4+3: four per pass
@pytest.mark.parametrize("cooperative", [False, True], ids=["per-row", "coop"])
def test_gl_matmul_matches_dequantised_reference(qtype, T, cooperative):
    dev = gl_device()
    n_cols = 512 if qtype in (Q.Q4_K, Q.Q6_K) else 96  # 96: rows of 3 blocks, odd block counts
    n_rows = 37
    raw = random_blocks(qtype, n_rows, n_cols)
    wf = quants.dequantize(raw, qtype).reshape(n_rows, n_cols).astype(np.float64)
    x = RNG.standard_normal((T, n_cols)).astype(np.float32)
    want = x.astype(np.float64) @ wf.T
    got = gl_matmul(dev, qtype, raw, n_cols, x, cooperative=cooperative)
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())
    # accumulate mode adds into what is there (the residual stream)
    base = RNG.standard_normal((T, n_rows)).astype(np.float32)
    got = gl_matmul(dev, qtype, raw, n_cols, x, acc=base, cooperative=cooperative)
    assert np.abs(got - (want + base)).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_gl_rmsnorm_matches_ops_and_adds_in_mode_1():
    dev = gl_device()
    x = RNG.standard_normal((5, 96)).astype(np.float32)
    w = RNG.standard_normal(96).astype(np.float32)
    want = np.empty_like(x)
    ops.rmsnorm(x, w, 1e-5, want)
    base = RNG.standard_normal((5, 96)).astype(np.float32)

    def fn(sc, offs, wb):
        dev.dispatch("rmsnorm", (1, 1), (sc, wb), (5, 96, offs[0], 96, offs[1], 96, 0, -1), (1e-5,))
        dev.dispatch("rmsnorm", (1, 1), (sc, wb), (5, 96, offs[0], 96, offs[2], 96, 1, -1), (1e-5,))

    wb = dev.ctx.call(dev.alloc, w.nbytes, "weights", w)
    try:
        _, got, added = run_on_scratch(dev, [x, np.zeros_like(x), base], fn, (wb,))
    finally:
        dev.ctx.call(dev.free, wb)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(added, base + want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("neox", [False, True])
def test_gl_rope_matches_ops(neox):
    from engine.config import Rope

    dev = gl_device()
    T, H, D = 3, 4, 16
    rope = Rope.make(
        12, 10000.0, neox, factors=np.linspace(1.0, 2.0, 6)
    )  # partial rotation, factors
    half = rope.n_rot // 2
    x = RNG.standard_normal((T, H, D)).astype(np.float32)
    pos = np.array([0, 7, 300])
    want = x.copy()
    ops.rope(want, pos, rope.inv_freq, neox)
    theta = pos[:, None] * rope.inv_freq[None]
    cs = np.concatenate([np.cos(theta), np.sin(theta)]).astype(np.float32)

    def fn(sc, offs):
        dev.dispatch(
            "rope",
            (n_groups(T * H * half), 1),
            (sc,),
            (offs[0], T, H, D, half, int(neox), offs[1], offs[1] + T * half),
        )

    got = run_on_scratch(dev, [x, cs], fn)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["silu", "gelu"])
def test_gl_gated_act_matches_ops(kind):
    dev = gl_device()
    g = (RNG.standard_normal((3, 40)) * 4).astype(np.float32)
    u = RNG.standard_normal((3, 40)).astype(np.float32)
    want = np.empty_like(g)
    ops.gated_act(kind, g.copy(), u, want)

    def fn(sc, offs):
        dev.dispatch(
            "gated_act",
            (n_groups(120), 1),
            (sc,),
            (offs[0], offs[1], 120, int(kind == "gelu"), 40, 40, 40),
        )

    got = run_on_scratch(dev, [g, u], fn)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def attention_ref(q, k, v, pos, window, scale):
    """float64 attention of each token (T, H, D) over its sequence's cached k/v (L, G, D)."""
    T, H, _ = q.shape
    G = k.shape[1]
    out = np.zeros((T, H, v.shape[2]))
    for t in range(T):
        lo = max(0, pos[t] - window + 1) if window else 0
        for h in range(H):
            g = h // (H // G)
            sc = k[lo : pos[t] + 1, g].astype(np.float64) @ q[t, h] * scale
            p = np.exp(sc - sc.max())
            out[t, h] = p @ v[lo : pos[t] + 1, g] / p.sum()
    return out


@pytest.mark.parametrize("f16", [False, True])
@pytest.mark.parametrize("window", [0, 5])
def test_gl_attention_gqa_causal_window(f16, window):
    dev = gl_device()
    H, G, D, L, n_cells = 4, 2, 32, 150, 160  # 150 positions: three chunks of 64
    k = RNG.standard_normal((L, G, D)).astype(np.float32)
    v = RNG.standard_normal((L, G, D)).astype(np.float32)
    pos = np.array([0, 63, 64, 149])
    q = RNG.standard_normal((len(pos), H, D)).astype(np.float32)
    kc, vc = np.zeros((n_cells, G, D), np.float32), np.zeros((n_cells, G, D), np.float32)
    kc[:L], vc[:L] = k, v
    if f16:
        kc, vc = kc.astype(np.float16), vc.astype(np.float16)
        k, v = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
    want = attention_ref(q, k, v, pos, window, 0.17)
    ints = np.zeros(3 * len(pos), np.int32)
    ints[: len(pos)] = pos  # then stream 0 and base 0 for every token
    out = np.zeros((len(pos), H, D), np.float32)

    def fn(sc, offs, kb, vb):
        T = len(pos)
        dev.dispatch(
            "attention",
            (H, T),
            (sc, kb, vb),
            (
                offs[0],
                offs[1],
                H,
                G,
                D,
                D,
                offs[2],
                offs[2] + T,
                offs[2] + 2 * T,
                n_cells,
                window,
                int(f16),
                int(f16),
            ),
            (0.17, 0.0),
        )

    kb = dev.ctx.call(dev.alloc, kc.nbytes, "kv", kc)
    vb = dev.ctx.call(dev.alloc, vc.nbytes, "kv", vc)
    try:
        got = run_on_scratch(dev, [q, out, ints.view(np.float32)], fn, (kb, vb))[1]
    finally:
        dev.ctx.call(dev.free, kb)
        dev.ctx.call(dev.free, vb)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_gl_one_dimensional_ops_cover_more_than_65535_workgroups():
    """Past 65535 workgroups (the least a driver must allow per dimension) a 1-D op spreads
    over a second dimension and still covers every element once."""
    from engine.backends.gl.device import MAX_GROUPS, groups_1d

    dev = gl_device()
    n = MAX_GROUPS * shaders.DEFAULT_LOCAL + 1000
    assert groups_1d(n)[1] == 2
    x = np.ones(n, np.float32)

    def fn(sc, offs):
        dev.dispatch("scale", groups_1d(n), (sc,), (offs[0], n), (3.0,))

    assert (run_on_scratch(dev, [x], fn)[0] == 3.0).all()


def test_gl_coop_matmul_spreads_rows_past_65535_workgroups():
    dev = gl_device()
    n_rows, n_cols = 65535 + 70, 32
    raw = random_blocks(Q.Q8_0, n_rows, n_cols)
    x = RNG.standard_normal((1, n_cols)).astype(np.float32)
    want = x.astype(np.float64) @ quants.dequantize(raw, Q.Q8_0).reshape(n_rows, n_cols).T
    got = gl_matmul(dev, Q.Q8_0, raw, n_cols, x, cooperative=True)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
