"""Shared pieces of the per-type kernels: x group sums and the checked public wrappers.

Each type module (q4_0.py ... k_quants.py, dense.py) describes its bit layout as an
`_ir.Layout`, builds its three private kernels from the same template (mat-vec for 1..T tokens
reading each weight row once, a fused mat-vec of 1..3 weights sharing x, dequantise rows) and
calls `register()` here, which wraps them with the public checks (dtype and contiguity in
Python, shapes inside the kernels) and returns the `QuantType` table entry. The template is
identical per type and deliberately not a factory: numba caches functions by source location,
so each type needs its own module-level kernels.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..jit import kernel
from ._ir import Layout
from .base import QuantType

_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)


@kernel
def group_sums(x, g):
    """(T, n) f32 -> (T, n // g) sums of x over consecutive groups of g (g <= 0: one dummy column)."""
    n_tok, n = x.shape
    if g <= 0:
        return np.zeros((n_tok, 1), np.float32)
    ng = n // g
    xs = np.empty((n_tok, ng), np.float32)
    for t in range(n_tok):
        for j in range(ng):
            s = np.float32(0.0)
            for i in range(g):
                s += x[t, j * g + i]
            xs[t, j] = s
    return xs


@kernel
def check_shapes(n_rows, row_bytes, x_cols, out_rows, x_tok, out_tok, block_bytes, block_elems):
    """Raise ValueError unless x / out fit a weight of n_rows rows of row_bytes packed bytes."""
    if row_bytes % block_bytes != 0:
        raise ValueError("weight row bytes are not a whole number of blocks for this type")
    if x_cols != row_bytes // block_bytes * block_elems:
        raise ValueError("x shape does not match the weight's n_cols")
    if out_rows != n_rows:
        raise ValueError("out shape does not match the weight's n_rows")
    if x_tok != out_tok:
        raise ValueError("x and out have different numbers of tokens")


def _f32c(a: np.ndarray, name: str) -> np.ndarray:
    if a.dtype != _F32:
        raise TypeError(f"{name} must be float32, got {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    return a


def _raw_rows(raw: np.ndarray) -> np.ndarray:
    """Packed rows as (n_rows, row_bytes) uint8 without copying (dense dtypes are viewed)."""
    if raw.dtype != _U8:
        if raw.ndim != 2 or not raw.flags.c_contiguous:
            raise ValueError("dense weight rows must be a C-contiguous 2-D array")
        return raw.view(_U8)
    if raw.ndim != 2 or raw.strides[1] != 1:
        raise ValueError(f"raw weight rows must be 2-D with contiguous rows, got shape {raw.shape}")
    return raw


def register(qtype: GGMLQuantizationType, layout: Layout, matvec_multi_k, matvec3_k,
             dequant_k) -> QuantType:
    """Wrap one type's private kernels with the public checks; returns its QUANT_TYPES entry.

    The wrappers only check dtype and contiguity (cheap Python attribute reads: the decode
    step calls matvec ~200 times per token); shapes are checked inside the kernels.
    """
    block_size, type_size = GGML_QUANT_SIZES[qtype]

    def matvec(raw: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        if x.ndim != 1 or out.ndim != 1:
            raise ValueError("matvec takes 1-D x and out (matvec_multi takes (n_tok, n) arrays)")
        r = _raw_rows(raw)
        o = _f32c(out, "out")
        e, eo = r[:0], o[:0]  # two empty weights: the fused kernel serves the single mat-vec
        matvec3_k(r, e, e, _f32c(x, "x"), o, eo, eo)

    def matvec_multi(raw: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        """out (T, n_rows) = x (T, n_cols) @ W.T, reading each weight row once for all T tokens."""
        if x.ndim != 2 or out.ndim != 2:
            raise ValueError("matvec_multi takes 2-D x (n_tok, n_cols) and out (n_tok, n_rows)")
        if x.shape[0]:
            matvec_multi_k(_raw_rows(raw), _f32c(x, "x"), _f32c(out, "out"))

    def matvec_same_x(raws, x: np.ndarray, outs) -> None:
        """outs[i] = W_i @ x for 1..3 weights of this type sharing x, in one parallel launch."""
        n = len(raws)
        if not 1 <= n <= 3 or len(outs) != n:
            raise ValueError("matvec_same_x takes 1 to 3 weights and as many outputs")
        if x.ndim != 1:
            raise ValueError("matvec_same_x takes a 1-D x")
        r = [_raw_rows(a) for a in raws]
        o = [_f32c(a, "out") for a in outs]
        while len(r) < 3:  # pad with an empty weight of the same array type
            r.append(r[0][:0])
            o.append(o[0][:0])
        matvec3_k(r[0], r[1], r[2], _f32c(x, "x"), o[0], o[1], o[2])

    def dequant(raw: np.ndarray, out: np.ndarray) -> None:
        if out.ndim != 2:
            raise ValueError("dequant out must be 2-D (n_rows, n_cols)")
        if raw.shape[0]:
            dequant_k(_raw_rows(raw), _f32c(out, "out"))

    def get_rows(raw: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
        ids = np.asarray(ids).reshape(-1)
        if out.ndim != 2:
            raise ValueError("get_rows out must be 2-D (len(ids), n_cols)")
        if ids.shape[0]:
            if int(ids.min()) < 0 or int(ids.max()) >= raw.shape[0]:
                raise ValueError("row id out of range")
            # Gather the packed rows (a few hundred bytes each), then one dequant launch.
            rows = np.take(raw, ids, axis=0)
            rows.flags.writeable = False  # same numba type as the read-only mmap rows
            dequant_k(_raw_rows(rows), _f32c(out, "out"))

    return QuantType(
        qtype=qtype, block_size=block_size, type_size=type_size, dequant=dequant, matvec=matvec,
        matvec_multi=matvec_multi, matvec_same_x=matvec_same_x, get_rows=get_rows,
        block_elems=layout.block_elems,
    )
