"""Numpy quantisers for IQ4_NL and IQ4_XS (gguf-py can only dequantise them), for tests.

Simpler than llama.cpp's quantize_row_iq4_nl (no scale search, no importance weights): each
group's scale maps its largest-magnitude weight onto the table's end (-127), then every weight
takes the nearest table value. The bytes are valid blocks of the ggml-common.h layouts, which
is all the tests need: they compare against gguf.quants.dequantize, not against these.
"""

from __future__ import annotations

import numpy as np

# ggml-common.h kvalues_iq4nl (kept here: tests must not take the spec from the engine)
KVALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32
)


def _group_scale(x: np.ndarray) -> np.ndarray:
    """(..., 32) -> (...,) scale putting each group's largest-magnitude weight at -127."""
    idx = np.abs(x).argmax(axis=-1)[..., None]
    return np.take_along_axis(x, idx, axis=-1)[..., 0] / -127.0


def _codes(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """(..., 32) weights and (...,) scales -> (..., 16) bytes of nearest-value nibbles
    (weight j < 16 in the low nibble of byte j, weight j + 16 in its high nibble)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d[..., None] != 0, x / d[..., None], 0.0)
    q = np.abs(v[..., None] - KVALUES).argmin(axis=-1).astype(np.uint8)
    return q[..., :16] | (q[..., 16:] << 4)


def quantize_iq4_nl(data: np.ndarray) -> np.ndarray:
    """(n_rows, n_cols) f32, n_cols % 32 == 0 -> (n_rows, n_cols // 32 * 18) uint8 blocks."""
    n_rows = data.shape[0]
    x = data.astype(np.float32).reshape(n_rows, -1, 32)
    d = _group_scale(x).astype(np.float16)
    qs = _codes(x, d.astype(np.float32))
    return np.concatenate([d[..., None].view(np.uint8), qs], axis=-1).reshape(n_rows, -1)


def quantize_iq4_xs(data: np.ndarray) -> np.ndarray:
    """(n_rows, n_cols) f32, n_cols % 256 == 0 -> (n_rows, n_cols // 256 * 136) uint8 blocks.

    Block: d f16 | scales_h u16 (2 high bits of group g's 6-bit scale at bit 2g) | scales_l
    4 bytes (low nibbles, group g in nibble g % 2 of byte g // 2) | qs 128 bytes (as IQ4_NL).
    """
    n_rows = data.shape[0]
    x = data.astype(np.float32).reshape(n_rows, -1, 8, 32)
    dg = _group_scale(x)  # (n_rows, nb, 8) wanted group scales
    big = np.take_along_axis(dg, np.abs(dg).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    d = (-big / 32.0).astype(np.float16)  # the largest group gets integer scale -32
    df = d.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = np.where(df != 0, np.rint(dg / df), 0.0)
    ls = (np.clip(ls, -32, 31) + 32).astype(np.uint16)  # (n_rows, nb, 8), stored 0..63
    qs = _codes(x, df * (ls.astype(np.float32) - 32))
    scales_h = np.zeros(ls.shape[:-1], np.uint16)
    for g in range(8):
        scales_h |= (ls[..., g] >> 4) << (2 * g)
    low = (ls & 15).astype(np.uint8)
    scales_l = low[..., 0::2] | (low[..., 1::2] << 4)
    parts = [
        d[..., None].view(np.uint8),
        scales_h[..., None].view(np.uint8),
        scales_l,
        qs.reshape(*qs.shape[:-2], 128),
    ]
    return np.concatenate(parts, axis=-1).reshape(n_rows, -1)
