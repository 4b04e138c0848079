"""Quantised weight kernels, dispatched through QUANT_TYPES keyed by GGML type.

Public API used by the models (never call per-type kernels directly):
    matvec(w, x, out)                 out (n_rows,)  = W @ x          decode path
    matvec_many(ws, x, outs)          outs[i] = ws[i] @ x, same-type weights fused in one launch
    matvec_multi(w, x, out)           out (T, n_rows) = x @ W.T, each weight row read once (T small)
    matmul(w, x, out, scratch)        out (n_tok, n_rows) = x @ W.T   batch path
    dequant_rows(w, r0, r1, out)      out (r1-r0, n_cols) float32
    get_rows(w, ids, out)             embedding lookup, out (len(ids), n_cols)

Every type has one module with its bit layout (q4_0.py ... k_quants.py, dense.py); the row
loops are LLVM vector IR built in _ir.py and run under numba `prange` over output rows.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from ..errors import UnsupportedQuantError
from . import dense, k_quants, q4_0, q4_1, q5_0, q5_1, q8_0
from .base import QTensor, QuantType
from .reference import dequant_ref

QUANT_TYPES: dict[GGMLQuantizationType, QuantType] = {
    qt.qtype: qt
    for qt in (
        dense.F32, dense.F16, dense.BF16,
        q4_0.Q4_0, q4_1.Q4_1, q5_0.Q5_0, q5_1.Q5_1, q8_0.Q8_0,
        k_quants.Q2_K, k_quants.Q3_K, k_quants.Q4_K, k_quants.Q5_K, k_quants.Q6_K,
    )
}

SUPPORTED = frozenset(QUANT_TYPES)

# Up to this many tokens the quantised mat-vec (weights read once for all tokens) beats
# dequantise + BLAS.
MATVEC_MAX_TOKENS = 8
# Most rows dequantised per BLAS tile in matmul (bounds the scratch: TILE_ROWS * n_cols floats).
TILE_ROWS = 1024
# Tiles are sized to about this many bytes of float32 so a tile stays in L2 for the GEMM.
_TILE_BYTES = 1 << 19


def check_supported(name: str, qtype: GGMLQuantizationType) -> None:
    if qtype not in SUPPORTED:
        raise UnsupportedQuantError(
            f"tensor '{name}' uses quantisation type {getattr(qtype, 'name', qtype)}, "
            f"which ggstation does not support (supported: "
            f"{', '.join(sorted(t.name for t in SUPPORTED))})"
        )


def _qt(w: QTensor) -> QuantType | None:
    qt = QUANT_TYPES.get(w.qtype)
    if qt is None:
        return None
    if w.n_cols % qt.block_elems:
        return None  # odd dense widths: the reference path serves
    return qt


def dequant_rows(w: QTensor, r0: int, r1: int, out: np.ndarray) -> None:
    qt = _qt(w)
    if qt is None:
        out[:] = dequant_ref(w.raw[r0:r1], w.qtype)
    else:
        qt.dequant(w.raw[r0:r1], out)


def get_rows(w: QTensor, ids: np.ndarray, out: np.ndarray) -> None:
    qt = _qt(w)
    if qt is None:
        for i, r in enumerate(np.asarray(ids).reshape(-1)):
            out[i] = dequant_ref(w.raw[int(r) : int(r) + 1], w.qtype)[0]
    else:
        qt.get_rows(w.raw, ids, out)


def matvec(w: QTensor, x: np.ndarray, out: np.ndarray) -> None:
    qt = _qt(w)
    if qt is None:
        out[:] = dequant_ref(w.raw, w.qtype) @ x
    else:
        qt.matvec(w.raw, x, out)


def matvec_many(ws: list[QTensor], x: np.ndarray, outs: list[np.ndarray]) -> None:
    """outs[i] = ws[i] @ x for weights sharing one input (Q/K/V, gate/up): weights of the same
    type go through one fused kernel launch (saves the per-call and thread wake-up overhead)."""
    groups: dict = {}
    for w, o in zip(ws, outs, strict=True):
        qt = _qt(w)
        if qt is None:
            matvec(w, x, o)
        else:
            groups.setdefault(qt.qtype, (qt, [], []))
            g = groups[qt.qtype]
            g[1].append(w.raw)
            g[2].append(o)
    for qt, raws, os_ in groups.values():
        for i in range(0, len(raws), 3):
            qt.matvec_same_x(raws[i : i + 3], x, os_[i : i + 3])


def matvec_multi(w: QTensor, x: np.ndarray, out: np.ndarray) -> None:
    """out (T, n_rows) = x (T, n_cols) @ W.T; one pass over the weights for all T tokens."""
    qt = _qt(w)
    if qt is None:
        out[:] = x @ dequant_ref(w.raw, w.qtype).T
    else:
        qt.matvec_multi(w.raw, x, out)


def tile_rows(n_cols: int) -> int:
    """Rows per dequantise+GEMM tile for a weight n_cols wide (<= TILE_ROWS)."""
    return int(max(16, min(TILE_ROWS, _TILE_BYTES // (4 * max(1, n_cols)))))


def matmul(w: QTensor, x: np.ndarray, out: np.ndarray, scratch: np.ndarray | None = None) -> None:
    """out (n_tok, n_rows) = x (n_tok, n_cols) @ W.T; scratch holds >= TILE_ROWS*n_cols floats."""
    n_tok = x.shape[0]
    if n_tok <= MATVEC_MAX_TOKENS:
        matvec_multi(w, x, out)
        return
    if w.qtype == GGMLQuantizationType.F32:
        np.matmul(x, w.raw.T, out=out)
        return
    tile = tile_rows(w.n_cols)
    if scratch is None:
        scratch = np.empty(tile * w.n_cols, np.float32)
    for r0 in range(0, w.n_rows, tile):
        r1 = min(r0 + tile, w.n_rows)
        wt = scratch[: (r1 - r0) * w.n_cols].reshape(r1 - r0, w.n_cols)
        dequant_rows(w, r0, r1, wt)
        np.matmul(x, wt.T, out=out[:, r0:r1])


__all__ = [
    "QTensor", "QuantType", "QUANT_TYPES", "SUPPORTED", "check_supported", "dequant_rows",
    "get_rows", "matvec", "matvec_many", "matvec_multi", "matmul", "tile_rows", "TILE_ROWS", "MATVEC_MAX_TOKENS",
]
