"""Q5_1: 32 weights per 24-byte block, w = d * q + m, q in 0..31."""

from __future__ import annotations

from gguf import GGMLQuantizationType
from numba import prange

from ..jit import parallel_kernel
from ._ir import I32, Group, Layout, make_row_dequant, make_row_dot
from ._kern import check_shapes, group_sums, register


# Block layout (24 bytes):
#   [0:2]   d   f16 scale
#   [2:4]   m   f16 minimum (offset)
#   [4:8]   qh  u32 little-endian; bit j is the 5th bit (value 16) of weight j
#   [8:24]  qs  16 bytes; low 4 bits of weight j (j < 16) = low nibble of qs[j],
#               of weight j + 16 = high nibble of qs[j]
class Q51Layout(Layout):
    block_elems, block_bytes, group = 32, 24, 32

    def groups(self, em, p):
        d, m = em.f16(p, 0), em.f16(p, 2)
        h0, h1 = em.bit_bytes(em.load(p, 4, I32), 16)
        q = em.bytes16(p, 8)
        lo = em.u8f(em.b.or_(em.nib_lo(q), h0))
        hi = em.u8f(em.b.or_(em.nib_hi(q), h1))
        return [Group(0, [lo, hi], d, m)]


_LAYOUT_q5_1 = Q51Layout()
_dot1_q5_1 = make_row_dot(_LAYOUT_q5_1, 1)
_dot2_q5_1 = make_row_dot(_LAYOUT_q5_1, 2)
_dot4_q5_1 = make_row_dot(_LAYOUT_q5_1, 4)
_row_dequant_q5_1 = make_row_dequant(_LAYOUT_q5_1)
_G_q5_1 = _LAYOUT_q5_1.group
_BB_q5_1 = _LAYOUT_q5_1.block_bytes
_BE_q5_1 = _LAYOUT_q5_1.block_elems


@parallel_kernel
def _matvec_multi_q5_1(raw, x, out):
    """out (T, n_rows) = x (T, n_cols) @ W.T; prange over rows (disjoint writes)."""
    check_shapes(raw.shape[0], raw.shape[1], x.shape[1], out.shape[1], x.shape[0], out.shape[0],
                 _BB_q5_1, _BE_q5_1)
    n_tok = x.shape[0]
    xs = group_sums(x, _G_q5_1)
    for r in prange(raw.shape[0]):
        t0 = 0
        while n_tok - t0 >= 4:
            _dot4_q5_1(raw, r, x, xs, out, t0)
            t0 += 4
        rem = n_tok - t0
        if rem >= 2:
            _dot2_q5_1(raw, r, x, xs, out, t0)
            t0 += 2
        if rem & 1:
            _dot1_q5_1(raw, r, x, xs, out, t0)


@parallel_kernel
def _matvec3_q5_1(raw0, raw1, raw2, x, out0, out1, out2):
    """out_i = W_i @ x for three weights of this type sharing x (e.g. Q, K, V), one launch."""
    n0, n1, n2 = raw0.shape[0], raw1.shape[0], raw2.shape[0]
    check_shapes(n0, raw0.shape[1], x.shape[0], out0.shape[0], 1, 1, _BB_q5_1, _BE_q5_1)
    check_shapes(n1, raw1.shape[1], x.shape[0], out1.shape[0], 1, 1, _BB_q5_1, _BE_q5_1)
    check_shapes(n2, raw2.shape[1], x.shape[0], out2.shape[0], 1, 1, _BB_q5_1, _BE_q5_1)
    x2 = x.reshape((1, x.shape[0]))
    o0 = out0.reshape((1, n0))
    o1 = out1.reshape((1, n1))
    o2 = out2.reshape((1, n2))
    xs = group_sums(x2, _G_q5_1)
    for r in prange(n0 + n1 + n2):
        if r < n0:
            _dot1_q5_1(raw0, r, x2, xs, o0, 0)
        elif r < n0 + n1:
            _dot1_q5_1(raw1, r - n0, x2, xs, o1, 0)
        else:
            _dot1_q5_1(raw2, r - n0 - n1, x2, xs, o2, 0)


@parallel_kernel
def _dequant_q5_1(raw, out):
    check_shapes(raw.shape[0], raw.shape[1], out.shape[1], raw.shape[0], 1, 1, _BB_q5_1, _BE_q5_1)
    if out.shape[0] != raw.shape[0]:
        raise ValueError("out has the wrong number of rows")
    for r in prange(raw.shape[0]):
        _row_dequant_q5_1(raw, r, out, r)


Q5_1 = register(
    GGMLQuantizationType.Q5_1, _LAYOUT_q5_1, _matvec_multi_q5_1, _matvec3_q5_1, _dequant_q5_1
)
