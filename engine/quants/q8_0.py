"""Q8_0: 32 weights per 34-byte block, w = d * q, q a signed byte.

The bit layout only: its kernels are generated into generated/q8_0.py by codegen.py.
"""

from __future__ import annotations

from ._ir import Group, IntBlock, IntPart, Layout, RpBlock, RpGroup, RpPart


# Block layout (34 bytes):
#   [0:2]   d   f16 scale
#   [2:34]  qs  32 signed bytes, weight j = qs[j]
class Q8_0Layout(Layout):
    block_elems, block_bytes, group = 32, 34, 0

    def groups(self, em, p):
        d = em.f16(p, 0)
        q0, q1 = em.s8f(em.bytes16(p, 2)), em.s8f(em.bytes16(p, 18))
        return [Group(0, [q0, q1], d, None)]

    def int_block(self, em, p):  # ggml_vec_dot_q8_0_q8_0
        return IntBlock(
            em.f16(p, 0), [IntPart(0, em.join(em.bytes16(p, 2), em.bytes16(p, 18)), True)]
        )

    rp_fields = ((0, 2, 0), (2, 32, 4))  # d, qs

    def rp_block(self, em, field, R):
        parts = [RpPart(4 * v, em.rp_chunk(field(1), v, R), True) for v in range(8)]
        return RpBlock(em.rp_f16(field(0), R), [RpGroup(parts, sums=(0,))])
