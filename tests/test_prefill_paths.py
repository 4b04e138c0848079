"""The prefill (many-token) paths: RoPE tables shared across layers, causal attention parts
trimmed to the keys they see, and batch matmul tiles spread evenly over the workers, each
against the plain computation."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from engine import ops, parallel, quants
from engine.quants import QTensor, dequant_rows

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_table_gives_ropes_results_bit_for_bit(neox):
    x = RNG.standard_normal((40, 5, 64)).astype(np.float32)
    y = x.copy()
    pos = np.arange(100, 140, dtype=np.int32)
    inv = (10000.0 ** (-np.arange(0, 48, 2) / 48)).astype(np.float64)  # partial rotary: 48 of 64
    ops.rope(x, pos, inv, neox, 1.25)
    ops.rope_apply(y, ops.rope_table(pos, inv, 1.25), neox)
    assert np.array_equal(x, y)


@pytest.mark.parametrize(
    ("window", "softcap", "sinks"), [(0, 0.0, False), (8, 0.0, False), (0, 30.0, True)]
)
def test_attention_parts_against_their_key_prefix_match_the_whole(window, softcap, sinks):
    """A chunk of queries given only keys k0.. (those it can see) gives the full call's rows."""
    m, H, G, D = 48, 4, 2, 16
    q = RNG.standard_normal((m, H, D)).astype(np.float32)
    kf = RNG.standard_normal((m, G, D)).astype(np.float32)
    vf = RNG.standard_normal((m, G, D)).astype(np.float32)
    pos = np.arange(m)
    sk = RNG.standard_normal(H).astype(np.float32) if sinks else None
    want = np.empty((m, H, D), np.float32)
    ops.attention_chunk(q, kf, vf, pos, window, 0.25, softcap, want, sk)
    got = np.empty_like(want)
    for a in range(0, m, 16):
        e = a + 16
        lo = max(0, a - window + 1) if window else 0
        ops.attention_chunk(
            q[a:e], kf[lo:e], vf[lo:e], pos[a:e], window, 0.25, softcap, got[a:e], sk, lo
        )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n_rows", [1, 3, 256, 1000])
def test_batch_matmul_tiles_cover_every_row_evenly(n_rows):
    parallel.set_pool_size(2)
    n_cols = 640
    data = RNG.standard_normal((n_rows, n_cols)).astype(np.float32)
    w = QTensor("w", Q.Q8_0, n_rows, n_cols, quantize(data, Q.Q8_0))
    t = quants._Tiles(
        w, np.zeros((64, n_cols), np.float32), np.zeros((64, n_rows), np.float32), None, "x16"
    )
    assert t.n_tiles % 2 == 0 or t.n_tiles == n_rows  # whole rounds of the two workers
    assert t.tile * t.n_tiles >= n_rows > t.tile * (t.n_tiles - 1)


def test_matmul_many_in_one_round_matches_separate_matmuls():
    parallel.set_pool_size(2)
    x = RNG.standard_normal((64, 256)).astype(np.float32)
    ws, outs, dense = [], [], []
    for n_rows, qt in ((300, Q.Q4_0), (64, Q.Q8_0), (1024, Q.F32)):
        data = RNG.standard_normal((n_rows, 256)).astype(np.float32)
        raw = data if qt == Q.F32 else quantize(data, qt)
        ws.append(QTensor("w", qt, n_rows, 256, raw))
        outs.append(np.zeros((64, n_rows), np.float32))
        d = np.empty((n_rows, 256), np.float32)
        dequant_rows(ws[-1], 0, n_rows, d)
        dense.append(d)
    scratch = np.empty(quants.TILE_ROWS * 256, np.float32)  # shared, as the forward pass does
    quants.matmul_many(ws, x, outs, scratch)
    for o, d in zip(outs, dense, strict=True):
        np.testing.assert_allclose(o, x @ d.T, rtol=1e-4, atol=1e-4)


def test_f32_tiles_read_the_weight_not_a_shared_scratch():
    """F32 rows go to BLAS as they are: a tile copied into a slice of the forward pass's
    shared scratch with no per-worker offset would race between the workers."""
    w = QTensor("w", Q.F32, 64, 32, RNG.standard_normal((64, 32)).astype(np.float32))
    t = quants._Tiles(
        w,
        np.zeros((16, 32), np.float32),
        np.zeros((16, 64), np.float32),
        np.empty(quants.TILE_ROWS * 32, np.float32),
        "x16",
    )
    assert t.scratch is None
