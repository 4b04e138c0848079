"""Shared pieces of the per-type kernels: x group sums, shape checks and the public checks.

Each type's kernels live in a generated module (engine/quants/generated/<qtype>.py, written
by codegen.py from one template over the type's hand-written `_ir.Layout`). Its public
wrappers (`matvec_q4_k`, ...) call the `launch_*` functions here, which check dtype and
contiguity in Python (cheap attribute reads: the decode step calls matvec ~200 times per
token) and then launch the type's njit kernel; shapes are checked inside the kernels.
"""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .. import jit, parallel
from ..mapped_pages import release_mapped_pages
from ._ir import Layout
from .table import QuantType

_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)


@jit.kernel
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


@jit.kernel
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


@jit.kernel
def code_sums(xq, g):
    """(T, n) int8 activation codes -> (T, n // g) int32 sums of each run of g codes."""
    n_tok, n = xq.shape
    nb = n // g
    out = np.zeros((n_tok, nb), np.int32)
    for t in range(n_tok):
        for b in range(nb):
            s = 0
            for i in range(g):
                s += xq[t, g * b + i]
            out[t, b] = s
    return out


@jit.kernel
def check_packed(
    n_groups, packed_cols, n_rows, x_cols, x_tok, out_tok, rows, block_bytes, block_elems
):
    """Raise ValueError unless a row-interleaved weight (n_groups, packed_cols) of `rows` rows
    a group fits x (x_tok, x_cols) and out (out_tok, n_rows)."""
    if x_cols % block_elems != 0 or packed_cols != x_cols // block_elems * rows * block_bytes:
        raise ValueError("x shape does not match the packed weight's n_cols")
    if n_groups != (n_rows + rows - 1) // rows:
        raise ValueError("out shape does not match the packed weight's n_rows")
    if x_tok != out_tok:
        raise ValueError("x and out have different numbers of tokens")


@functools.lru_cache(maxsize=256)  # a prefill's tiles unpack the same few shapes again and again
def rp_gather(layout: Layout, rows: int, row_bytes: int) -> tuple[np.ndarray, int]:
    """(index, unit): unit i of one interleaved block group (rows * block_bytes bytes, as
    repack_rows lays it out) is the unit at offset index[i] of the source rows seen as a flat
    array of `unit`-byte words, counted from the group's first row's block. unit (4, 2 or 1)
    is the widest that divides every field piece, the block and the row."""
    pieces = []  # (source byte offset in the block, bytes, row), in the group's order
    for off, size, chunk in layout.rp_fields:
        for src, n in (
            [(off + c * chunk, chunk) for c in range(size // chunk)] if chunk else [(off, size)]
        ):
            pieces += [(src, n, r) for r in range(rows)]
    unit = 4
    while (
        any((src | n) % unit for src, n, _ in pieces)
        or layout.block_bytes % unit
        or row_bytes % unit
    ):
        unit //= 2
    index = [(r * row_bytes + src) // unit + j for src, n, r in pieces for j in range(n // unit)]
    out = np.array(index, np.int64)
    out.flags.writeable = False  # shared by every caller (cached)
    return out, unit


@jit.kernel
def repack_groups(src, out, index, rows, block_units, g0, g1):
    """out[g0:g1] (groups of `rows` rows, as units) = the rows of src (n_rows, row_units)
    gathered through `index` (rp_gather), block after block. Serial and GIL-free: callers
    spread slices over threads."""
    row_units = src.shape[1]
    nb = row_units // block_units
    gu = index.shape[0]
    flat = src.reshape(-1)
    for g in range(g0, g1):
        for b in range(nb):
            s0 = g * rows * row_units + b * block_units
            d0 = b * gu
            for i in range(gu):
                out[g, d0 + i] = flat[s0 + index[i]]


def repack_rows(layout: Layout, raw: np.ndarray, rows: int) -> np.ndarray:
    """The packed rows raw (n_rows, row_bytes) of a type with a row-interleaved form, as
    (ceil(n_rows / rows), row_bytes * rows) uint8: per group of `rows` rows (the last padded
    with zero rows, whose outputs are never stored) and per block, each of layout.rp_fields in
    turn, plain fields row after row, chunked ones as chunks (4 bytes or 1) of every row, chunk
    after chunk (make_group_dot_i8 reads them). A permutation of the bytes: the same size."""
    r = _raw_rows(raw)
    bb = layout.block_bytes
    if sum(size for _, size, _ in layout.rp_fields) != bb:
        raise ValueError(f"{type(layout).__name__}.rp_fields do not cover its {bb}-byte block")
    n_rows, row_bytes = r.shape
    if row_bytes % bb:
        raise ValueError("weight row bytes are not a whole number of blocks for this type")
    n_groups, n_full = -(-n_rows // rows), n_rows // rows
    out = np.empty((n_groups, row_bytes * rows), np.uint8)
    index, unit = rp_gather(layout, rows, row_bytes)
    dt = np.dtype(f"u{unit}")
    src, dst, bu = np.ascontiguousarray(r).view(dt), out.view(dt), bb // unit
    if n_full < n_groups:  # the last group's rows, padded with zero rows
        tail = np.zeros((rows, row_bytes), np.uint8)
        tail[: n_rows - n_full * rows] = r[n_full * rows :]
        repack_groups(tail.view(dt), dst[n_full:], index, rows, bu, 0, 1)
    # groups per slice: ~1 MiB, and two slices a worker thread at least
    step = max(1, min((1 << 20) // (row_bytes * rows), -(-n_full // (2 * parallel.pool_size()))))

    def repack_slice(part: int, worker: int) -> None:
        g0, g1 = part * step, min(n_full, (part + 1) * step)
        repack_groups(src, dst, index, rows, bu, g0, g1)
        # a mapped weight's copied rows leave RAM as they go (QTensor.packed releases the rest),
        # so a big tensor's copy never holds both forms whole (Gemma 3 270M's embedding: 170 MiB)
        release_mapped_pages(r[g0 * rows : g1 * rows])

    # the kernel lets the GIL go: the slices spread over the batch path's worker threads
    parallel.run_parts(repack_slice, -(-n_full // step))
    return out


def unpack_rows(layout: Layout, packed: np.ndarray, rows: int, r0: int, r1: int) -> np.ndarray:
    """Rows r0..r1 of a weight in their GGML layout again, from its repack_rows copy (rows a
    group): the inverse permutation, for the prefill's dequantised tiles once the decode
    has let the mapped rows go (QTensor.packed)."""
    bb = layout.block_bytes
    g0, g1 = r0 // rows, -(-r1 // rows)
    row_bytes = packed.shape[1] // rows
    index, unit = rp_gather(layout, rows, row_bytes)
    dt = np.dtype(f"u{unit}")
    out = np.empty(((g1 - g0) * rows, row_bytes), np.uint8)
    unpack_groups(packed[g0:g1].view(dt), out.view(dt), index, rows, bb // unit)
    return out[r0 - g0 * rows : r1 - g0 * rows]


@jit.kernel
def unpack_groups(packed, out, index, rows, block_units):
    """The inverse of repack_groups: out (groups * rows, row_units) from the interleaved groups
    `packed` (groups, rows * row_units), through the same `index` (rp_gather)."""
    row_units = out.shape[1]
    nb = row_units // block_units
    gu = index.shape[0]
    flat = out.reshape(-1)
    for g in range(packed.shape[0]):
        for b in range(nb):
            d0 = g * rows * row_units + b * block_units
            s0 = b * gu
            for i in range(gu):
                flat[d0 + index[i]] = packed[g, s0 + i]


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


def launch_matvec(kernel, raw: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out (n_rows,) = W @ x through a type's fused 1..3-weight kernel (_matvec_<qtype>)."""
    if x.ndim != 1 or out.ndim != 1:
        raise ValueError("matvec takes 1-D x and out (matvec_multi takes (n_tok, n) arrays)")
    r = _raw_rows(raw)
    o = _f32c(out, "out")
    e, eo = r[:0], o[:0]  # two empty weights: the fused kernel serves the single mat-vec
    kernel(r, e, e, _f32c(x, "x"), o, eo, eo)


def launch_matvec_same_x(kernel, raws, x: np.ndarray, outs) -> None:
    """outs[i] = W_i @ x for 1..3 weights of one type sharing x, in one parallel launch."""
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
    kernel(r[0], r[1], r[2], _f32c(x, "x"), o[0], o[1], o[2])


def launch_matvec_multi(kernel, raw: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out (T, n_rows) = x (T, n_cols) @ W.T, reading each weight row once for all T tokens."""
    if x.ndim != 2 or out.ndim != 2:
        raise ValueError("matvec_multi takes 2-D x (n_tok, n_cols) and out (n_tok, n_rows)")
    if x.shape[0]:
        kernel(_raw_rows(raw), _f32c(x, "x"), _f32c(out, "out"))


def launch_matvec_multi_same_x(kernel, raws, x: np.ndarray, outs) -> None:
    """outs[i] (T, n_i) = x (T, n_cols) @ W_i.T for 1..3 weights of one type sharing x, in one
    parallel launch: x is quantised once, and the three mat-vecs cost one thread wake-up."""
    n = len(raws)
    if not 1 <= n <= 3 or len(outs) != n:
        raise ValueError("matvec_multi_same_x takes 1 to 3 weights and as many outputs")
    if x.ndim != 2 or any(o.ndim != 2 for o in outs):
        raise ValueError("matvec_multi_same_x takes 2-D x (n_tok, n_cols) and outs (n_tok, n_rows)")
    if not x.shape[0]:
        return
    r = [_raw_rows(a) for a in raws]
    o = [_f32c(a, "out") for a in outs]
    while len(r) < 3:  # pad with an empty weight of the same array type
        r.append(r[0][:0])
        o.append(np.empty((x.shape[0], 0), np.float32))
    kernel(r[0], r[1], r[2], _f32c(x, "x"), o[0], o[1], o[2])


def launch_dequant(kernel, raw: np.ndarray, out: np.ndarray) -> None:
    """out (n_rows, n_cols) = the weights of the packed rows raw, as float32."""
    if out.ndim != 2:
        raise ValueError("dequant out must be 2-D (n_rows, n_cols)")
    if raw.shape[0]:
        kernel(_raw_rows(raw), _f32c(out, "out"))


def launch_get_rows(kernel, raw: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
    """out (len(ids), n_cols) = rows ids of the weight, dequantised (embedding lookup)."""
    ids = np.asarray(ids).reshape(-1)
    if out.ndim != 2:
        raise ValueError("get_rows out must be 2-D (len(ids), n_cols)")
    if ids.shape[0]:
        if int(ids.min()) < 0 or int(ids.max()) >= raw.shape[0]:
            raise ValueError("row id out of range")
        # Gather the packed rows (a few hundred bytes each), then one dequant launch.
        rows = np.take(raw, ids, axis=0)
        rows.flags.writeable = False  # same numba type as the read-only mmap rows
        kernel(_raw_rows(rows), _f32c(out, "out"))


def quant_type(qtype: GGMLQuantizationType, layout: Layout, **ops) -> QuantType:
    """A type's QUANT_TYPES entry from its layout and public wrappers (QuantType fields)."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return QuantType(
        qtype=qtype,
        block_size=block_size,
        type_size=type_size,
        block_elems=layout.block_elems,
        **ops,
    )
