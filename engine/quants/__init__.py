"""Quantised weight kernels, dispatched through QUANT_TYPES keyed by GGML type.

Public API used by the models (never call per-type kernels directly):
    matvec(w, x, out)                 out (n_rows,)  = W @ x          decode path
    matvec_many(ws, x, outs)          outs[i] = ws[i] @ x, same-type weights fused in one launch
    matvec_multi(w, x, out)           out (T, n_rows) = x @ W.T, each weight row read once (T small)
    matvec_multi_many(ws, x, outs)    matvec_multi for weights sharing x, same-type ones in one launch
    matmul(w, x, out, scratch)        out (n_tok, n_rows) = x @ W.T   batch path
    matmul_many(ws, x, outs, scratch) matmul for weights sharing x (fused launch for 1 token)
    warmup(w)                         compile / load every kernel of w's type
    dequant_rows(w, r0, r1, out)      out (r1-r0, n_cols) float32
    get_rows(w, ids, out)             embedding lookup, out (len(ids), n_cols)

Every type has a hand-written bit layout (q4_0.py ... k_quants.py, iq4.py, mxfp4.py, dense.py)
from which _ir.py builds the row loops as LLVM vector IR; the kernels running them under numba
`prange` over output rows are generated per type from one template (codegen.py ->
generated/<qtype>.py, with greppable entry points such as `matvec_q4_k`, `dequant_q6_k`).

Decode (matvec, matvec_many, matvec_multi) has three formulations, DECODE_PATHS, which the
caller names (`path`): a context decodes on its own path (Context.decode_path, from
ContextParams.decode_path or the model's load_model(decode_path=...)) and passes it down with
every call. The float path (`--no-int8`, GGSTATION_NO_INT8=1) unpacks the weights to float32
and pays one FMA per weight: the tested oracle. The default, "x16", writes x in two 8-bit
planes a block (_q8.quantize_planes: ~15 bits) and takes integer dots of both with the
row-interleaved copy (below): float-grade numbers (~5e-6 relative) at integer speed; types
without that copy keep the float path. "int8" (GGSTATION_INT8=1 or `--int8`) selects
llama.cpp's int8 formulation for the block types instead: x quantised once per mat-vec to the
type's vec_dot_type (_q8.py), integer dots per block, float scales per block
(matvec_i8_<qtype>); prefill (matmul beyond MATVEC_MAX_TOKENS) then rounds its activations to
the same grid, so prefilled and decoded tokens see the same numbers. The block types (each
with a row-interleaved form, Layout.rp_block) run the
default's and int8's mat-vecs on a copy of their rows interleaved 8 or 16 at a time
(QTensor.packed, made on first use; matvec_*_rp16_<qtype>, matvec_*_rp_<qtype>); path_op picks
the kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import numpy as np
from gguf import GGMLQuantizationType

from .. import jit, parallel
from . import _q8
from .base import ExpertTensor, QTensor
from .reference import dequant_ref
from .table import INTERLEAVED_TYPES, QUANT_TYPES, SUPPORTED, QuantType, check_supported

# Up to this many tokens a ubatch runs the decode kernels (weights decoded once for all tokens)
# rather than dequantise + BLAS: the float mat-vec is ~equal to BLAS at 12-16 tokens (OpenBLAS
# sgemm is slow for thin x), the interleaved kernels faster; and the same kernels per token make
# a prompt of up to this many tokens give the bits of the same tokens decoded one by one, as
# llama.cpp's do (a cached prompt then changes no sampled token: llama.cpp's server test
# test_n_probs_post_backend_sampling compares the two).
MATVEC_MAX_TOKENS = 16
# Most rows dequantised per BLAS tile in matmul (bounds the scratch: TILE_ROWS * n_cols floats).
TILE_ROWS = 1024
# Tile size in bytes of float32 weights: small tiles for thin batches, ~L2-sized for prefill
# (2 MiB: 270-280 GFLOP/s on two cores for Gemma 3 270M's projections at 512 tokens, where 1 MiB
# gave 215-258).
_TILE_BYTES_THIN = 1 << 18
_TILE_BYTES = 1 << 21


DECODE_PATHS = ("x16", "int8", "float")
# The path of a model loaded without one (and of a call here that names none): the environment's
# (jit.DECODE_PATH), or what set_default_decode_path made it. Read when a model is loaded, not
# per mat-vec: the decode passes its context's path down.
_default_path = jit.DECODE_PATH


@functools.cache
def vec_dot_types() -> dict[GGMLQuantizationType, str]:
    """llama.cpp's vec_dot_type of each type with an int8 path: "q8_0", "q8_1" or "q8_k"."""
    from .codegen import (
        TYPES,
    )  # not at import: `python -m engine.quants.codegen` imports this package

    return {GGMLQuantizationType[s.name]: s.vec_dot for s in TYPES if s.vec_dot}


def check_decode_path(path: str) -> str:
    """`path` when it is one of the mat-vecs' formulations: "x16" (the default: integer dots over
    x in two 8-bit planes, ~15 bits, on the row-interleaved copies; float for the types without
    one), "int8" (llama.cpp's: x quantised once to the type's Q8 blocks) or "float" (the oracle:
    float32 x times the weights unpacked to float).

    Raises:
        ValueError: any other name.
    """
    if path not in DECODE_PATHS:
        raise ValueError(f"decode path {path!r} is not one of {', '.join(DECODE_PATHS)}")
    return path


def default_decode_path() -> str:
    """The path a model is loaded for when its parameters name none (GGSTATION_INT8=1 "int8",
    GGSTATION_NO_INT8=1 "float", else "x16", unless set_default_decode_path changed it)."""
    return _default_path


def set_default_decode_path(path: str) -> None:
    """Change default_decode_path for the models loaded from now on: for tests and measuring
    scripts that build their models deep inside helpers (tests/conftest.py's INT8_MODULES and
    FLOAT_MODULES); an engine's own path travels in its parameters (ContextParams.decode_path)."""
    global _default_path
    _default_path = check_decode_path(path)


def round_to_vec_dot(x: np.ndarray, vec_dot: str) -> tuple[np.ndarray, np.ndarray | None]:
    """x (T, n) rounded onto the grid the int8 mat-vec sees: each block's codes times its
    scale, from the same quantiser (_q8.quantize_q8_0, q8_1 or q8_k). The BLAS prefill
    multiplies this instead of x, so that a token's logits are the same (to summation order)
    whether it was prefilled or decoded, as llama.cpp's are (its GEMM also quantises the
    activations to the weight's vec_dot_type): a cached prompt prefix then changes no greedy
    reply.

    Q8_1's dot adds min * s per block with s = d * sum(codes) rounded to f16, not the sum of
    the rounded x; the second result (T, n // 32) is that difference s - sum(x), for the
    caller to multiply by the weight's block minimums (None for the other grids)."""
    x = np.ascontiguousarray(x, np.float32)
    quantize = {"q8_0": _q8.quantize_q8_0, "q8_1": _q8.quantize_q8_1, "q8_k": _q8.quantize_q8_k}[
        vec_dot
    ]
    xq, xd, xs = quantize(x)
    T, n = x.shape
    nb = xd.shape[1]
    codes = xq.reshape(T, nb, n // nb).astype(np.float32)
    xr = (codes * xd[:, :, None]).reshape(T, n)
    if vec_dot != "q8_1":
        return xr, None
    return xr, xs - xd * codes.sum(axis=2)


def raw_rows(w: QTensor, r0: int, r1: int) -> np.ndarray:
    """Rows r0..r1 of w in its GGML layout: from the mapped file, or from the interleaved copy
    once the int8 path made one (it then lets the mapped pages go: QTensor.packed)."""
    qt = QUANT_TYPES.get(w.qtype)
    if qt is not None and qt.unpack is not None and w.packed_nbytes:
        packed = w.packed
        assert packed is not None
        return qt.unpack(packed, r0, r1)
    return w.raw[r0:r1]


def _block_mins(w: QTensor, r0: int, r1: int) -> np.ndarray:
    """(r1 - r0, n_cols // 32) float32 block minimums of Q4_1/Q5_1 rows (f16 at bytes 2..4)."""
    blocks = raw_rows(w, r0, r1).reshape(r1 - r0, w.n_cols // 32, -1)
    return np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16)[:, :, 0].astype(np.float32)


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
        rows = raw_rows(w, r0, r1)
        rows.flags.writeable = (
            False  # the mapped file's rows are read-only: one kernel type for both
        )
        qt.dequant(rows, out)


def get_rows(w: QTensor, ids: np.ndarray, out: np.ndarray) -> None:
    qt = _qt(w)
    if qt is None:
        for i, r in enumerate(np.asarray(ids).reshape(-1)):
            out[i] = dequant_ref(w.raw[int(r) : int(r) + 1], w.qtype)[0]
    else:
        qt.get_rows(w.raw, ids, out)


def interleaved(w: QTensor, qt: QuantType, path: str | None = None) -> bool:
    """Whether w's mat-vecs run on its row-interleaved copy (QTensor.packed) on the decode path
    (None: default_decode_path()): every path but the float one, for the types that have that
    form (qt: w's QUANT_TYPES entry, _qt checked)."""
    return (path or _default_path) != "float" and qt.repack is not None and w.pack


def rows(w: QTensor, qt: QuantType, path: str | None = None) -> np.ndarray:
    """The array w's decode kernels take on the path: the interleaved copy or raw."""
    if interleaved(w, qt, path):
        packed = w.packed
        assert packed is not None  # _qt checked the shape, and the type has the form
        return packed
    return w.raw


def path_op(qt: QuantType, rp: bool, op: str, path: str | None = None) -> Callable | None:
    """The public wrapper of QuantType field `op` ("matvec", "matvec_same_x", "matvec_multi",
    "matvec_multi_same_x") on the decode path (None: default_decode_path()); rp: the weights are
    interleaved (the wrapper then takes their copies). The interleaved copy's kernels (_rp for
    int8, _rp16 for the default), else the int8 rows' (_i8), else the float ones. None when the
    type has no such op. The one choice that quants' dispatch and the compiled steps share."""
    path = path or _default_path
    if rp:
        return getattr(qt, f"{op}_rp" if path == "int8" else f"{op}_rp16")
    i8 = getattr(qt, f"{op}_i8") if path == "int8" else None
    return i8 if i8 is not None else getattr(qt, op)


# The mat-vecs below take the decode path of the caller's context (`path`, one of DECODE_PATHS;
# None: default_decode_path(), for tests and scripts that call them alone).


def matvec(w: QTensor, x: np.ndarray, out: np.ndarray, path: str | None = None) -> None:
    path = path or _default_path
    qt = _qt(w)
    if qt is None:
        out[:] = dequant_ref(w.raw, w.qtype) @ x
    else:
        rp = interleaved(w, qt, path)
        _kernel(qt, rp, "matvec", path)(rows(w, qt, path), x, out)


def matvec_many(
    ws: list[QTensor], x: np.ndarray, outs: list[np.ndarray], path: str | None = None
) -> None:
    """outs[i] = ws[i] @ x for weights sharing one input (Q/K/V, gate/up): weights of the same
    type go through one fused kernel launch (saves the per-call and thread wake-up overhead)."""
    path = path or _default_path
    qt = _qt(ws[0]) if ws else None
    if (
        qt is not None
        and len(ws) <= 3
        and len(outs) == len(ws)
        and all(w.qtype == qt.qtype and _qt(w) is not None and w.pack == ws[0].pack for w in ws)
    ):
        # common case: one launch
        _same_x(qt, interleaved(ws[0], qt, path), path)([rows(w, qt, path) for w in ws], x, outs)
        return
    for qt, rp, raws, os_ in _by_type(ws, x, outs, lambda qt: True, matvec, path):
        _same_x(qt, rp, path)(raws, x, os_)


def _by_type(
    ws: list[QTensor],
    x: np.ndarray,
    outs: list[np.ndarray],
    fusable: Callable[[QuantType], bool],
    alone: Callable[[QTensor, np.ndarray, np.ndarray, str], None],
    path: str,
) -> Iterator[tuple[QuantType, bool, list, list]]:
    """Weights sharing x grouped by type and form (interleaved or not), at most 3 a group (the
    fused kernels' arity), for one launch each, as (type, interleaved, rows, outs); a weight
    whose type has no fused kernel runs through `alone` first."""
    groups: dict[tuple[GGMLQuantizationType, bool], tuple[QuantType, bool, list, list]] = {}
    for w, o in zip(ws, outs, strict=True):
        qt = _qt(w)
        if qt is None or not fusable(qt):
            alone(w, x, o, path)
        else:
            rp = interleaved(w, qt, path)
            g = groups.setdefault((qt.qtype, rp), (qt, rp, [], []))
            g[2].append(rows(w, qt, path))
            g[3].append(o)
    for qt, rp, raws, os_ in groups.values():
        for i in range(0, len(raws), 3):
            yield qt, rp, raws[i : i + 3], os_[i : i + 3]


def _kernel(qt: QuantType, rp: bool, op: str, path: str) -> Callable:
    """path_op's wrapper for an op the caller knows the type has (every type has the mat-vecs;
    the fused ones are asked for after a check)."""
    f = path_op(qt, rp, op, path)
    assert f is not None, f"{qt.qtype.name} has no {op}"
    return f


def _same_x(qt: QuantType, rp: bool, path: str) -> Callable:
    """The fused 1..3-weight one-token kernel of the path (rp: on interleaved copies)."""
    return _kernel(qt, rp, "matvec_same_x", path)


def _multi_same_x(qt: QuantType, rp: bool, path: str) -> Callable:
    return _kernel(qt, rp, "matvec_multi_same_x", path)


def matvec_multi_many(
    ws: list[QTensor], x: np.ndarray, outs: list[np.ndarray], path: str | None = None
) -> None:
    """outs[i] (T, n_i) = x (T, n_cols) @ ws[i].T for weights sharing x (Q/K/V, gate/up of a
    few tokens: slots decoding together): weights of one type go through one launch, which
    quantises x once (int8 path) and wakes the threads once; the same results as matvec_multi
    on each."""
    path = path or _default_path
    for qt, rp, raws, os_ in _by_type(
        ws, x, outs, lambda qt: qt.matvec_multi_same_x is not None, matvec_multi, path
    ):
        _multi_same_x(qt, rp, path)(raws, x, os_)


def matvec_multi(w: QTensor, x: np.ndarray, out: np.ndarray, path: str | None = None) -> None:
    """out (T, n_rows) = x (T, n_cols) @ W.T; one pass over the weights for all T tokens."""
    path = path or _default_path
    qt = _qt(w)
    if qt is None:
        out[:] = x @ dequant_ref(w.raw, w.qtype).T
    else:
        rp = interleaved(w, qt, path)
        _kernel(qt, rp, "matvec_multi", path)(rows(w, qt, path), x, out)


def tile_rows(n_cols: int, n_tok: int = 512) -> int:
    """Rows per dequantise+GEMM tile for a weight n_cols wide (16 <= rows <= TILE_ROWS)."""
    nbytes = _TILE_BYTES_THIN if n_tok < 32 else _TILE_BYTES
    return int(max(16, min(TILE_ROWS, nbytes // (4 * max(1, n_cols)))))


def matmul(
    w: QTensor,
    x: np.ndarray,
    out: np.ndarray,
    scratch: np.ndarray | None = None,
    path: str | None = None,
) -> None:
    """out (n_tok, n_rows) = x (n_tok, n_cols) @ W.T; scratch holds >= TILE_ROWS*n_cols floats;
    path: the decode path (its int8 form rounds the prefill's x to the int8 grid too).

    Few tokens: quantised mat-vec reading each weight row once. Many: tiles of rows are
    dequantised into the scratch and multiplied with single-threaded BLAS, the tiles spread
    over engine.parallel's workers (each worker owns one slice of the scratch).
    """
    path = path or _default_path
    if x.shape[0] <= MATVEC_MAX_TOKENS:
        matvec_multi(w, x, out, path)
        return
    _run_tiles([_Tiles(w, x, out, scratch, path)])


class _Tiles:
    """One weight's share of a batch matmul: its rows in tiles, each dequantised into the
    worker's slice of the scratch and multiplied by BLAS (F32 weights: by row ranges, no
    copy). The tile count is a whole number of rounds of the workers, so that the static
    striping of parallel.run_parts leaves none of them idle at the end (a 256-row K of a
    640-wide model was one tile: one core)."""

    def __init__(
        self, w: QTensor, x: np.ndarray, out: np.ndarray, scratch: np.ndarray | None, path: str
    ):
        n_workers = parallel.pool_size()
        self.w, self.out, self.s_err, self.stride = w, out, None, 0
        if path == "int8" and w.qtype in vec_dot_types():
            x, self.s_err = round_to_vec_dot(x, vec_dot_types()[w.qtype])
        self.x = x
        if w.qtype == GGMLQuantizationType.F32:
            tile = -(-w.n_rows // n_workers)
            scratch = None  # BLAS reads the rows themselves
        else:
            tile = tile_rows(w.n_cols, x.shape[0])
            if scratch is None:
                scratch = np.empty(n_workers * tile * w.n_cols, np.float32)
            # each worker owns one fixed slice of the scratch, whatever weight it works on
            self.stride = scratch.size // n_workers
            tile = max(1, min(tile, self.stride // w.n_cols))
        n_tiles = -(-w.n_rows // tile)
        n_tiles = min(w.n_rows, -(-n_tiles // n_workers) * n_workers)
        self.tile = -(-w.n_rows // n_tiles)
        self.n_tiles = -(-w.n_rows // self.tile)
        self.scratch = scratch

    def run(self, i: int, worker: int) -> None:
        w, x, out = self.w, self.x, self.out
        r0, r1 = i * self.tile, min((i + 1) * self.tile, w.n_rows)
        if self.scratch is None:  # F32: the rows themselves
            np.matmul(x, w.raw[r0:r1].T, out=out[:, r0:r1])
            return
        at = worker * self.stride
        wt = self.scratch[at : at + (r1 - r0) * w.n_cols].reshape(r1 - r0, w.n_cols)
        dequant_rows(w, r0, r1, wt)
        np.matmul(x, wt.T, out=out[:, r0:r1])
        if self.s_err is not None:
            out[:, r0:r1] += self.s_err @ _block_mins(w, r0, r1).T


def _run_tiles(jobs: list[_Tiles]) -> None:
    """Every tile of the jobs in one round of the pool (one wake-up for Q, K and V)."""
    index = [(j, i) for j in jobs for i in range(j.n_tiles)]
    parallel.run_parts(lambda p, worker: index[p][0].run(index[p][1], worker), len(index))


def matmul_many(
    ws: list[QTensor],
    x: np.ndarray,
    outs: list[np.ndarray],
    scratch: np.ndarray | None = None,
    path: str | None = None,
) -> None:
    """outs[i] = x @ ws[i].T for weights sharing the input x (Q/K/V, gate/up).

    Same result as calling matmul for each; for up to MATVEC_MAX_TOKENS tokens (decode, one
    or several slots) the weights of one type run in a single fused kernel launch, and for
    more the tiles of all of them in one round of the worker pool.
    """
    path = path or _default_path
    if x.shape[0] == 1:
        matvec_many(ws, x.reshape(-1), [o.reshape(-1) for o in outs], path)
    elif x.shape[0] <= MATVEC_MAX_TOKENS:
        matvec_multi_many(ws, x, outs, path)
    else:
        _run_tiles([_Tiles(w, x, o, scratch, path) for w, o in zip(ws, outs, strict=True)])


def warmup(w: QTensor, path: str | None = None) -> None:
    """Compile (or load from numba's cache) every kernel of w's type, on w's first row.

    Uses the same array types as real calls (read-only packed rows, float32 C arrays), so the
    first request does not pay for compilation; path: the decode path whose kernels to load.
    """
    qt = _qt(w)
    if qt is None:
        return
    row = QTensor(w.name, w.qtype, 1, w.n_cols, w.raw[:1])
    x = np.zeros((1, w.n_cols), np.float32)
    out = np.zeros((1, 1), np.float32)
    matvec(row, x[0], out[0], path)  # fused 1..3-weight mat-vec kernel (decode)
    matvec_multi(row, x, out, path)  # 1..8 tokens
    matvec_multi_many([row], x, [out], path)  # fused Q/K/V, gate/up of 2..8 tokens
    dequant_rows(row, 0, 1, np.zeros((1, w.n_cols), np.float32))  # prefill tiles, get_rows


__all__ = [
    "ExpertTensor",
    "QTensor",
    "QuantType",
    "QUANT_TYPES",
    "SUPPORTED",
    "INTERLEAVED_TYPES",
    "check_supported",
    "dequant_rows",
    "get_rows",
    "matvec",
    "matvec_many",
    "matvec_multi",
    "matvec_multi_many",
    "matmul",
    "matmul_many",
    "tile_rows",
    "warmup",
    "TILE_ROWS",
    "MATVEC_MAX_TOKENS",
    "interleaved",
    "rows",
    "DECODE_PATHS",
    "check_decode_path",
    "default_decode_path",
    "set_default_decode_path",
    "path_op",
]
