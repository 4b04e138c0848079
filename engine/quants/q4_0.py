"""Q4_0: 32 weights per 18-byte block, w = d * (q - 8), q in 0..15.

The bit layout only: its kernels are generated into generated/q4_0.py by codegen.py.
"""

from __future__ import annotations

from ._ir import Group, IntBlock, IntPart, Layout, RpBlock, RpGroup, rp_nibble_parts


# Block layout (18 bytes):
#   [0:2]   d   f16 scale
#   [2:18]  qs  16 bytes; weight j (j < 16) = low nibble of qs[j], weight j + 16 = high nibble
# q - 8 is formed in bytes and read as signed, so there is no offset term.
class Q4_0Layout(Layout):
    block_elems, block_bytes, group = 32, 18, 0

    def groups(self, em, p):
        d = em.f16(p, 0)
        q = em.bytes16(p, 2)
        lo, hi = em.s8f(em.sub8(em.nib_lo(q), 8)), em.s8f(em.sub8(em.nib_hi(q), 8))
        return [Group(0, [lo, hi], d)]

    def int_block(self, em, p):  # ggml_vec_dot_q4_0_q8_0
        q = em.bytes16(p, 2)
        w = em.join(em.sub8(em.nib_lo(q), 8), em.sub8(em.nib_hi(q), 8))
        return IntBlock(em.f16(p, 0), [IntPart(0, w, True)])

    rp_fields = ((0, 2, 0), (2, 16, 4))  # d, qs

    def rp_block(self, em, field, R):  # codes q in 0..15 for the weights q - 8: offset 8
        return RpBlock(
            em.rp_f16(field(0), R), [RpGroup(rp_nibble_parts(em, field(1), R), offset=8, sums=(0,))]
        )
