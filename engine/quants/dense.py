"""Dense weights (F32, F16, BF16) through the same row kernels: one group per 16 weights, d = 1.

The public wrappers hand these kernels the rows as bytes (`raw.view(np.uint8)`, no copy), so
one uint8 signature serves every dense dtype; n_cols must be a multiple of 16.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType
from numba import prange

from ..jit import parallel_kernel
from ._ir import V16F, V16I16, V16I32, Group, Layout, make_row_dequant, make_row_dot
from ._kern import check_shapes, group_sums, register


# F32 row: 4 bytes per weight, little-endian IEEE single.
class F32Layout(Layout):
    block_elems, block_bytes, group = 16, 64, 0

    def groups(self, em, p):
        return [Group(0, [em.load(p, 0, V16F)])]


# F16 row: 2 bytes per weight, IEEE half.
class F16Layout(Layout):
    block_elems, block_bytes, group = 16, 32, 0

    def groups(self, em, p):
        return [Group(0, [em.half_to_float(em.load(p, 0, V16I16))])]


# BF16 row: 2 bytes per weight, the high half of an IEEE single (value = bits << 16).
class BF16Layout(Layout):
    block_elems, block_bytes, group = 16, 32, 0

    def groups(self, em, p):
        b = em.b
        w = b.shl(b.zext(em.load(p, 0, V16I16), V16I32), em.vconst32(16))
        return [Group(0, [b.bitcast(w, V16F)])]


_LAYOUT_f32 = F32Layout()
_dot1_f32 = make_row_dot(_LAYOUT_f32, 1)
_dot2_f32 = make_row_dot(_LAYOUT_f32, 2)
_dot4_f32 = make_row_dot(_LAYOUT_f32, 4)
_row_dequant_f32 = make_row_dequant(_LAYOUT_f32)
_G_f32 = _LAYOUT_f32.group
_BB_f32 = _LAYOUT_f32.block_bytes
_BE_f32 = _LAYOUT_f32.block_elems


@parallel_kernel
def _matvec_multi_f32(raw, x, out):
    """out (T, n_rows) = x (T, n_cols) @ W.T; prange over rows (disjoint writes)."""
    check_shapes(raw.shape[0], raw.shape[1], x.shape[1], out.shape[1], x.shape[0], out.shape[0],
                 _BB_f32, _BE_f32)
    n_tok = x.shape[0]
    xs = group_sums(x, _G_f32)
    for r in prange(raw.shape[0]):
        t0 = 0
        while n_tok - t0 >= 4:
            _dot4_f32(raw, r, x, xs, out, t0)
            t0 += 4
        rem = n_tok - t0
        if rem >= 2:
            _dot2_f32(raw, r, x, xs, out, t0)
            t0 += 2
        if rem & 1:
            _dot1_f32(raw, r, x, xs, out, t0)


@parallel_kernel
def _matvec3_f32(raw0, raw1, raw2, x, out0, out1, out2):
    """out_i = W_i @ x for three weights of this type sharing x (e.g. Q, K, V), one launch."""
    n0, n1, n2 = raw0.shape[0], raw1.shape[0], raw2.shape[0]
    check_shapes(n0, raw0.shape[1], x.shape[0], out0.shape[0], 1, 1, _BB_f32, _BE_f32)
    check_shapes(n1, raw1.shape[1], x.shape[0], out1.shape[0], 1, 1, _BB_f32, _BE_f32)
    check_shapes(n2, raw2.shape[1], x.shape[0], out2.shape[0], 1, 1, _BB_f32, _BE_f32)
    x2 = x.reshape((1, x.shape[0]))
    o0 = out0.reshape((1, n0))
    o1 = out1.reshape((1, n1))
    o2 = out2.reshape((1, n2))
    xs = group_sums(x2, _G_f32)
    for r in prange(n0 + n1 + n2):
        if r < n0:
            _dot1_f32(raw0, r, x2, xs, o0, 0)
        elif r < n0 + n1:
            _dot1_f32(raw1, r - n0, x2, xs, o1, 0)
        else:
            _dot1_f32(raw2, r - n0 - n1, x2, xs, o2, 0)


@parallel_kernel
def _dequant_f32(raw, out):
    check_shapes(raw.shape[0], raw.shape[1], out.shape[1], raw.shape[0], 1, 1, _BB_f32, _BE_f32)
    if out.shape[0] != raw.shape[0]:
        raise ValueError("out has the wrong number of rows")
    for r in prange(raw.shape[0]):
        _row_dequant_f32(raw, r, out, r)


F32 = register(
    GGMLQuantizationType.F32, _LAYOUT_f32, _matvec_multi_f32, _matvec3_f32, _dequant_f32
)


_LAYOUT_f16 = F16Layout()
_dot1_f16 = make_row_dot(_LAYOUT_f16, 1)
_dot2_f16 = make_row_dot(_LAYOUT_f16, 2)
_dot4_f16 = make_row_dot(_LAYOUT_f16, 4)
_row_dequant_f16 = make_row_dequant(_LAYOUT_f16)
_G_f16 = _LAYOUT_f16.group
_BB_f16 = _LAYOUT_f16.block_bytes
_BE_f16 = _LAYOUT_f16.block_elems


@parallel_kernel
def _matvec_multi_f16(raw, x, out):
    """out (T, n_rows) = x (T, n_cols) @ W.T; prange over rows (disjoint writes)."""
    check_shapes(raw.shape[0], raw.shape[1], x.shape[1], out.shape[1], x.shape[0], out.shape[0],
                 _BB_f16, _BE_f16)
    n_tok = x.shape[0]
    xs = group_sums(x, _G_f16)
    for r in prange(raw.shape[0]):
        t0 = 0
        while n_tok - t0 >= 4:
            _dot4_f16(raw, r, x, xs, out, t0)
            t0 += 4
        rem = n_tok - t0
        if rem >= 2:
            _dot2_f16(raw, r, x, xs, out, t0)
            t0 += 2
        if rem & 1:
            _dot1_f16(raw, r, x, xs, out, t0)


@parallel_kernel
def _matvec3_f16(raw0, raw1, raw2, x, out0, out1, out2):
    """out_i = W_i @ x for three weights of this type sharing x (e.g. Q, K, V), one launch."""
    n0, n1, n2 = raw0.shape[0], raw1.shape[0], raw2.shape[0]
    check_shapes(n0, raw0.shape[1], x.shape[0], out0.shape[0], 1, 1, _BB_f16, _BE_f16)
    check_shapes(n1, raw1.shape[1], x.shape[0], out1.shape[0], 1, 1, _BB_f16, _BE_f16)
    check_shapes(n2, raw2.shape[1], x.shape[0], out2.shape[0], 1, 1, _BB_f16, _BE_f16)
    x2 = x.reshape((1, x.shape[0]))
    o0 = out0.reshape((1, n0))
    o1 = out1.reshape((1, n1))
    o2 = out2.reshape((1, n2))
    xs = group_sums(x2, _G_f16)
    for r in prange(n0 + n1 + n2):
        if r < n0:
            _dot1_f16(raw0, r, x2, xs, o0, 0)
        elif r < n0 + n1:
            _dot1_f16(raw1, r - n0, x2, xs, o1, 0)
        else:
            _dot1_f16(raw2, r - n0 - n1, x2, xs, o2, 0)


@parallel_kernel
def _dequant_f16(raw, out):
    check_shapes(raw.shape[0], raw.shape[1], out.shape[1], raw.shape[0], 1, 1, _BB_f16, _BE_f16)
    if out.shape[0] != raw.shape[0]:
        raise ValueError("out has the wrong number of rows")
    for r in prange(raw.shape[0]):
        _row_dequant_f16(raw, r, out, r)


F16 = register(
    GGMLQuantizationType.F16, _LAYOUT_f16, _matvec_multi_f16, _matvec3_f16, _dequant_f16
)


_LAYOUT_bf16 = BF16Layout()
_dot1_bf16 = make_row_dot(_LAYOUT_bf16, 1)
_dot2_bf16 = make_row_dot(_LAYOUT_bf16, 2)
_dot4_bf16 = make_row_dot(_LAYOUT_bf16, 4)
_row_dequant_bf16 = make_row_dequant(_LAYOUT_bf16)
_G_bf16 = _LAYOUT_bf16.group
_BB_bf16 = _LAYOUT_bf16.block_bytes
_BE_bf16 = _LAYOUT_bf16.block_elems


@parallel_kernel
def _matvec_multi_bf16(raw, x, out):
    """out (T, n_rows) = x (T, n_cols) @ W.T; prange over rows (disjoint writes)."""
    check_shapes(raw.shape[0], raw.shape[1], x.shape[1], out.shape[1], x.shape[0], out.shape[0],
                 _BB_bf16, _BE_bf16)
    n_tok = x.shape[0]
    xs = group_sums(x, _G_bf16)
    for r in prange(raw.shape[0]):
        t0 = 0
        while n_tok - t0 >= 4:
            _dot4_bf16(raw, r, x, xs, out, t0)
            t0 += 4
        rem = n_tok - t0
        if rem >= 2:
            _dot2_bf16(raw, r, x, xs, out, t0)
            t0 += 2
        if rem & 1:
            _dot1_bf16(raw, r, x, xs, out, t0)


@parallel_kernel
def _matvec3_bf16(raw0, raw1, raw2, x, out0, out1, out2):
    """out_i = W_i @ x for three weights of this type sharing x (e.g. Q, K, V), one launch."""
    n0, n1, n2 = raw0.shape[0], raw1.shape[0], raw2.shape[0]
    check_shapes(n0, raw0.shape[1], x.shape[0], out0.shape[0], 1, 1, _BB_bf16, _BE_bf16)
    check_shapes(n1, raw1.shape[1], x.shape[0], out1.shape[0], 1, 1, _BB_bf16, _BE_bf16)
    check_shapes(n2, raw2.shape[1], x.shape[0], out2.shape[0], 1, 1, _BB_bf16, _BE_bf16)
    x2 = x.reshape((1, x.shape[0]))
    o0 = out0.reshape((1, n0))
    o1 = out1.reshape((1, n1))
    o2 = out2.reshape((1, n2))
    xs = group_sums(x2, _G_bf16)
    for r in prange(n0 + n1 + n2):
        if r < n0:
            _dot1_bf16(raw0, r, x2, xs, o0, 0)
        elif r < n0 + n1:
            _dot1_bf16(raw1, r - n0, x2, xs, o1, 0)
        else:
            _dot1_bf16(raw2, r - n0 - n1, x2, xs, o2, 0)


@parallel_kernel
def _dequant_bf16(raw, out):
    check_shapes(raw.shape[0], raw.shape[1], out.shape[1], raw.shape[0], 1, 1, _BB_bf16, _BE_bf16)
    if out.shape[0] != raw.shape[0]:
        raise ValueError("out has the wrong number of rows")
    for r in prange(raw.shape[0]):
        _row_dequant_bf16(raw, r, out, r)


BF16 = register(
    GGMLQuantizationType.BF16, _LAYOUT_bf16, _matvec_multi_bf16, _matvec3_bf16, _dequant_bf16
)
