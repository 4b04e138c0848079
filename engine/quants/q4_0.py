"""Q4_0: 32 weights per 18-byte block, w = d * (q - 8), q in 0..15."""

from __future__ import annotations

from gguf import GGMLQuantizationType
from numba import prange

from ..jit import parallel_kernel
from ._ir import Group, Layout, make_row_dequant, make_row_dot
from ._kern import check_shapes, group_sums, register


# Block layout (18 bytes):
#   [0:2]   d   f16 scale
#   [2:18]  qs  16 bytes; weight j (j < 16) = low nibble of qs[j], weight j + 16 = high nibble
# q - 8 is formed in bytes and read as signed, so there is no offset term.
class Q40Layout(Layout):
    block_elems, block_bytes, group = 32, 18, 0

    def groups(self, em, p):
        d = em.f16(p, 0)
        q = em.bytes16(p, 2)
        lo, hi = em.s8f(em.sub8(em.nib_lo(q), 8)), em.s8f(em.sub8(em.nib_hi(q), 8))
        return [Group(0, [lo, hi], d)]


_LAYOUT_q4_0 = Q40Layout()
_dot1_q4_0 = make_row_dot(_LAYOUT_q4_0, 1)
_dot2_q4_0 = make_row_dot(_LAYOUT_q4_0, 2)
_dot4_q4_0 = make_row_dot(_LAYOUT_q4_0, 4)
_row_dequant_q4_0 = make_row_dequant(_LAYOUT_q4_0)
_G_q4_0 = _LAYOUT_q4_0.group
_BB_q4_0 = _LAYOUT_q4_0.block_bytes
_BE_q4_0 = _LAYOUT_q4_0.block_elems


@parallel_kernel
def _matvec_multi_q4_0(raw, x, out):
    """out (T, n_rows) = x (T, n_cols) @ W.T; prange over rows (disjoint writes)."""
    check_shapes(raw.shape[0], raw.shape[1], x.shape[1], out.shape[1], x.shape[0], out.shape[0],
                 _BB_q4_0, _BE_q4_0)
    n_tok = x.shape[0]
    xs = group_sums(x, _G_q4_0)
    for r in prange(raw.shape[0]):
        t0 = 0
        while n_tok - t0 >= 4:
            _dot4_q4_0(raw, r, x, xs, out, t0)
            t0 += 4
        rem = n_tok - t0
        if rem >= 2:
            _dot2_q4_0(raw, r, x, xs, out, t0)
            t0 += 2
        if rem & 1:
            _dot1_q4_0(raw, r, x, xs, out, t0)


@parallel_kernel
def _matvec3_q4_0(raw0, raw1, raw2, x, out0, out1, out2):
    """out_i = W_i @ x for three weights of this type sharing x (e.g. Q, K, V), one launch."""
    n0, n1, n2 = raw0.shape[0], raw1.shape[0], raw2.shape[0]
    check_shapes(n0, raw0.shape[1], x.shape[0], out0.shape[0], 1, 1, _BB_q4_0, _BE_q4_0)
    check_shapes(n1, raw1.shape[1], x.shape[0], out1.shape[0], 1, 1, _BB_q4_0, _BE_q4_0)
    check_shapes(n2, raw2.shape[1], x.shape[0], out2.shape[0], 1, 1, _BB_q4_0, _BE_q4_0)
    x2 = x.reshape((1, x.shape[0]))
    o0 = out0.reshape((1, n0))
    o1 = out1.reshape((1, n1))
    o2 = out2.reshape((1, n2))
    xs = group_sums(x2, _G_q4_0)
    for r in prange(n0 + n1 + n2):
        if r < n0:
            _dot1_q4_0(raw0, r, x2, xs, o0, 0)
        elif r < n0 + n1:
            _dot1_q4_0(raw1, r - n0, x2, xs, o1, 0)
        else:
            _dot1_q4_0(raw2, r - n0 - n1, x2, xs, o2, 0)


@parallel_kernel
def _dequant_q4_0(raw, out):
    check_shapes(raw.shape[0], raw.shape[1], out.shape[1], raw.shape[0], 1, 1, _BB_q4_0, _BE_q4_0)
    if out.shape[0] != raw.shape[0]:
        raise ValueError("out has the wrong number of rows")
    for r in prange(raw.shape[0]):
        _row_dequant_q4_0(raw, r, out, r)


Q4_0 = register(
    GGMLQuantizationType.Q4_0, _LAYOUT_q4_0, _matvec_multi_q4_0, _matvec3_q4_0, _dequant_q4_0
)
