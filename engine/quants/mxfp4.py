"""MXFP4 (OCP microscaling, gpt-oss): 32 e2m1 4-bit floats sharing one power-of-two scale.

The e2m1 values are read, doubled to integers, through a 16-entry table (llama.cpp's
kvalues_mxfp4; Emit.lut16, one pshufb on x86) and the E8M0 scale is halved to match
(ggml_e8m0_to_fp32_half), so w = d * q with q a small integer as for the other types.
The layout only: the kernels are generated into generated/mxfp4.py by codegen.py.
"""

from __future__ import annotations

from ._ir import Group, IntBlock, IntPart, Layout, RpBlock, RpGroup, rp_nibble_parts

# ggml-common.h kvalues_mxfp4: 2 * the e2m1 value of each code (bit 3 is the sign).
KVALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


# MXFP4 block (17 bytes):
#   [0]     e   E8M0 scale: 2^(e - 127); d = 2^(e - 128) pairs with the doubled values
#   [1:17]  qs  16 bytes; weight j (j < 16) = low nibble of qs[j], weight j + 16 = high nibble
#   w = d * KVALUES[q]
class MXFP4Layout(Layout):
    block_elems, block_bytes, group = 32, 17, 0

    def groups(self, em, p):
        q = em.bytes16(p, 1)
        codes = em.lut16(KVALUES, [em.nib_lo(q), em.nib_hi(q)])
        return [Group(0, [em.s8f(v) for v in codes], em.e8m0_half(p, 0))]

    def int_block(self, em, p):  # ggml_vec_dot_mxfp4_q8_0
        q = em.bytes16(p, 1)
        codes = em.lut16(KVALUES, [em.nib_lo(q), em.nib_hi(q)])
        return IntBlock(em.e8m0_half(p, 0), [IntPart(0, em.join(*codes), True)])

    rp_fields = ((0, 1, 0), (1, 16, 4))  # e, qs

    def rp_block(self, em, field, R):
        parts = rp_nibble_parts(em, field(1), R, lambda q: em.lut16_wide(KVALUES, q), True)
        return RpBlock(em.e8m0_half_of(em.rp_byte(field(0), 0, R)), [RpGroup(parts, sums=(0,))])
