"""Q5_0: 32 weights per 22-byte block, w = d * (q - 16), q in 0..31.

The bit layout only: its kernels are generated into generated/q5_0.py by codegen.py.
"""

from __future__ import annotations

from llvmlite import ir

from ._ir import I32, Group, IntBlock, IntPart, Layout, RpBlock, RpGroup, RpPart


# Block layout (22 bytes):
#   [0:2]   d   f16 scale
#   [2:6]   qh  u32 little-endian; bit j is the 5th bit (value 16) of weight j
#   [6:22]  qs  16 bytes; low 4 bits of weight j (j < 16) = low nibble of qs[j],
#               of weight j + 16 = high nibble of qs[j]
# q - 16 is formed in bytes and read as signed, so there is no offset term.
class Q5_0Layout(Layout):
    block_elems, block_bytes, group = 32, 22, 0

    def groups(self, em, p):
        d = em.f16(p, 0)
        h0, h1 = em.bit_words(p, 2, 0, -16)  # q - 16: the high bit's 16 cancels the offset
        q = em.words16(p, 6)
        lo = em.s8f(em.b.add(em.nib_lo(q), h0))
        hi = em.s8f(em.b.add(em.nib_hi(q), h1))
        return [Group(0, [lo, hi], d)]

    def int_block(self, em, p):  # ggml_vec_dot_q5_0_q8_0
        h0, h1 = em.bit_bytes(em.load(p, 2, I32), 16)
        q = em.bytes16(p, 6)
        w = em.join(
            em.sub8(em.b.or_(em.nib_lo(q), h0), 16), em.sub8(em.b.or_(em.nib_hi(q), h1), 16)
        )
        return IntBlock(em.f16(p, 0), [IntPart(0, w, True)])

    rp_fields = ((0, 2, 0), (2, 4, 4), (6, 16, 4))  # d, qh (one i32 lane a row), qs

    def rp_block(self, em, field, R):  # codes q in 0..31 for the weights q - 16: offset 16
        return RpBlock(
            em.rp_f16(field(0), R),
            [RpGroup(rp_q5_parts(em, field(1), field(2), R), offset=16, sums=(0,))],
        )


def rp_q5_parts(em, qh_field, qs_field, R):
    """The 5-bit codes of an interleaved Q5_0 / Q5_1 block as 8 RpParts: nibbles from the
    chunked qs, fifth bits from qh (one i32 lane a row)."""
    qh = em.b.bitcast(em.rp_chunk(qh_field, 0, R), ir.VectorType(I32, R))
    parts = []
    for v in range(4):
        q = em.rp_chunk(qs_field, v, R)
        parts += [
            RpPart(4 * v, em.b.or_(em.nib_lo(q), em.rp_bits16(qh, 4 * v, R)), False),
            RpPart(16 + 4 * v, em.b.or_(em.nib_hi(q), em.rp_bits16(qh, 16 + 4 * v, R)), False),
        ]
    return parts
