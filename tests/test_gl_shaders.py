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
from gl_helpers import gl_device, run_on_scratch

RNG = np.random.default_rng(7)


def random_blocks(qtype: Q, n_rows: int, n_cols: int) -> np.ndarray:
    """(n_rows, row_bytes) packed rows: gguf's quantiser for the legacy types; for K-quants
    random bytes with small finite f16 scale fields (gguf cannot quantise them)."""
    if qtype in (Q.F32, Q.F16):
        data = RNG.standard_normal((n_rows, n_cols)).astype(np.float32)
        return data.astype(np.float16 if qtype == Q.F16 else np.float32).view(np.uint8).reshape(n_rows, -1)
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


def gl_matmul(dev, qtype: Q, raw: np.ndarray, n_cols: int, x: np.ndarray, acc: np.ndarray | None = None):
    n_rows, T = raw.shape[0], x.shape[0]
    out = np.zeros((T, n_rows), np.float32) if acc is None else acc.copy()

    def fn(sc, offs, w):
        dev.dispatch("matmul_" + qtype.name.lower(), (n_groups(n_rows), n_groups(T, shaders.MATMUL_TOKENS)),
                     (sc, w), (n_rows, n_cols, raw.shape[1], T, offs[0], n_cols, offs[1], n_rows,
                               int(acc is not None)))

    w = dev.ctx.call(dev.alloc, raw.nbytes, "weights", np.ascontiguousarray(raw))
    try:
        return run_on_scratch(dev, [x, out], fn, (w,))[1]
    finally:
        dev.ctx.call(dev.free, w)


@pytest.mark.parametrize("qtype", sorted(shaders.MATMUL_TYPES, key=lambda q: q.name), ids=lambda q: q.name)
@pytest.mark.parametrize("T", [1, 11])
def test_gl_matmul_matches_dequantised_reference(qtype, T):
    dev = gl_device()
    n_cols = 512 if qtype in (Q.Q4_K, Q.Q6_K) else 96  # 96: rows of 3 blocks, odd block counts
    n_rows = 37
    raw = random_blocks(qtype, n_rows, n_cols)
    wf = quants.dequantize(raw, qtype).reshape(n_rows, n_cols).astype(np.float64)
    x = RNG.standard_normal((T, n_cols)).astype(np.float32)
    want = x.astype(np.float64) @ wf.T
    got = gl_matmul(dev, qtype, raw, n_cols, x)
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())
    # accumulate mode adds into what is there (the residual stream)
    base = RNG.standard_normal((T, n_rows)).astype(np.float32)
    got = gl_matmul(dev, qtype, raw, n_cols, x, acc=base)
    assert np.abs(got - (want + base)).max() <= 1e-4 * max(1.0, np.abs(want).max())
