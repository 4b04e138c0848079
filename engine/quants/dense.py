"""Dense weights (F32, F16, BF16) through the same row kernels: one group per 16 weights, d = 1.

The public wrappers hand these kernels the rows as bytes (`raw.view(np.uint8)`, no copy), so
one uint8 signature serves every dense dtype; n_cols must be a multiple of 16. The layouts
only: the kernels are generated into generated/f32.py, f16.py, bf16.py by codegen.py.
"""

from __future__ import annotations

from ._ir import V16F, V16I16, V16I32, Group, Layout


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
