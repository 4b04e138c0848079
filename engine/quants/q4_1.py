"""Q4_1: 32 weights per 20-byte block, w = d * q + m, q in 0..15.

The bit layout only: its kernels are generated into generated/q4_1.py by codegen.py.
"""

from __future__ import annotations

from ._ir import Group, IntBlock, IntPart, Layout, RpBlock, RpGroup, rp_nibble_parts


# Block layout (20 bytes):
#   [0:2]   d   f16 scale
#   [2:4]   m   f16 minimum (offset)
#   [4:20]  qs  16 bytes; weight j (j < 16) = low nibble of qs[j], weight j + 16 = high nibble
class Q4_1Layout(Layout):
    block_elems, block_bytes, group = 32, 20, 32

    def groups(self, em, p):
        d, m = em.f16_pair(p, 0)
        w = em.words16(p, 4)
        return [Group(0, [em.u8f(em.nib_lo(w)), em.u8f(em.nib_hi(w))], d, m)]

    def int_block(self, em, p):  # ggml_vec_dot_q4_1_q8_1
        q = em.bytes16(p, 4)
        w = em.join(em.nib_lo(q), em.nib_hi(q))
        return IntBlock(em.f16(p, 0), [IntPart(0, w, False)], m=em.f16(p, 2))

    rp_fields = ((0, 2, 0), (2, 2, 0), (4, 16, 4))  # d, m, qs

    def rp_block(self, em, field, R):
        return RpBlock(
            em.rp_f16(field(0), R),
            [RpGroup(rp_nibble_parts(em, field(2), R))],
            m=em.rp_f16(field(1), R),
        )
