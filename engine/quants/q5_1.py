"""Q5_1: 32 weights per 24-byte block, w = d * q + m, q in 0..31.

The bit layout only: its kernels are generated into generated/q5_1.py by codegen.py.
"""

from __future__ import annotations

from ._ir import I32, Group, IntBlock, IntPart, Layout, RpBlock, RpGroup
from .q5_0 import rp_q5_parts


# Block layout (24 bytes):
#   [0:2]   d   f16 scale
#   [2:4]   m   f16 minimum (offset)
#   [4:8]   qh  u32 little-endian; bit j is the 5th bit (value 16) of weight j
#   [8:24]  qs  16 bytes; low 4 bits of weight j (j < 16) = low nibble of qs[j],
#               of weight j + 16 = high nibble of qs[j]
class Q5_1Layout(Layout):
    block_elems, block_bytes, group = 32, 24, 32

    def groups(self, em, p):
        d, m = em.f16_pair(p, 0)
        h0, h1 = em.bit_words(p, 4, 16)
        q = em.words16(p, 8)
        lo = em.u8f(em.b.or_(em.nib_lo(q), h0))
        hi = em.u8f(em.b.or_(em.nib_hi(q), h1))
        return [Group(0, [lo, hi], d, m)]

    def int_block(self, em, p):  # ggml_vec_dot_q5_1_q8_1
        h0, h1 = em.bit_bytes(em.load(p, 4, I32), 16)
        q = em.bytes16(p, 8)
        w = em.join(em.b.or_(em.nib_lo(q), h0), em.b.or_(em.nib_hi(q), h1))
        return IntBlock(em.f16(p, 0), [IntPart(0, w, False)], m=em.f16(p, 2))

    rp_fields = ((0, 2, 0), (2, 2, 0), (4, 4, 4), (8, 16, 4))  # d, m, qh (one i32 lane a row), qs

    def rp_block(self, em, field, R):
        parts = rp_q5_parts(em, field(2), field(3), R)
        return RpBlock(em.rp_f16(field(0), R), [RpGroup(parts)], m=em.rp_f16(field(1), R))
