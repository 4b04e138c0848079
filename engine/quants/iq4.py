"""IQ4_NL and IQ4_XS: 4-bit codes read through a fixed non-linear table, w = d * KVALUES[q].

KVALUES (llama.cpp's kvalues_iq4nl) bunch the 16 levels near zero, where most weights are, so
4 bits lose less than Q4_0's even grid. The lookup of a vector of 16 codes is Emit.lut16 (one
pshufb on x86); the table values are small integers, so w = d * q keeps the float form of the
other types (q exact as float, d per group). The layouts only: the kernels are generated into
generated/iq4_nl.py and iq4_xs.py by codegen.py.
"""

from __future__ import annotations

from llvmlite import ir

from ._ir import (
    F32,
    I16,
    I32,
    Group,
    IntBlock,
    IntPart,
    Layout,
    RpBlock,
    RpGroup,
    rp_const,
    rp_nibble_parts,
)

# ggml-common.h kvalues_iq4nl: the value of each 4-bit code.
KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _c(v):
    return ir.Constant(I32, v)


def _codes(em, p, off, n):
    """The 32 * n codes packed in the 16 * n bytes at p + off, as 2n <16 x i8> table values:
    in each 16 bytes weight j (j < 16) is the low nibble of byte j, weight j + 16 its high one."""
    nibs = []
    for k in range(n):
        q = em.bytes16(p, off + 16 * k)
        nibs += [em.nib_lo(q), em.nib_hi(q)]
    return em.lut16(KVALUES, nibs)


def _xs_scale(em, p, scales_h, g):
    """The 6-bit scale of IQ4_XS group g, minus 32 (i32)."""
    b = em.b
    lo = b.and_(b.lshr(em.u8(p, 4 + g // 2), _c(4 * (g % 2))), _c(15))
    hi = b.and_(b.lshr(scales_h, _c(2 * g)), _c(3))
    return b.sub(b.or_(lo, b.shl(hi, _c(4))), _c(32))


# IQ4_NL block (18 bytes), laid out as Q4_0:
#   [0:2]   d   f16 scale
#   [2:18]  qs  16 bytes; weight j (j < 16) = low nibble of qs[j], weight j + 16 = high nibble
#   w = d * KVALUES[q]
class IQ4_NLLayout(Layout):
    block_elems, block_bytes, group = 32, 18, 0

    def groups(self, em, p):
        return [Group(0, [em.s8f(v) for v in _codes(em, p, 2, 1)], em.f16(p, 0))]

    def int_block(self, em, p):  # ggml_vec_dot_iq4_nl_q8_0
        return IntBlock(em.f16(p, 0), [IntPart(0, em.join(*_codes(em, p, 2, 1)), True)])

    rp_fields = ((0, 2, 0), (2, 16, 4))  # d, qs

    def rp_block(self, em, field, R):
        parts = rp_nibble_parts(em, field(1), R, lambda q: em.lut16_wide(KVALUES, q), True)
        return RpBlock(em.rp_f16(field(0), R), [RpGroup(parts, sums=(0,))])


# IQ4_XS super-block (136 bytes), 8 groups of 32 weights:
#   [0:2]    d         f16 super-scale
#   [2:4]    scales_h  u16; bits 2g..2g+1 are the high 2 bits of the 6-bit scale of group g
#   [4:8]    scales_l  nibble g % 2 of byte g // 2 is the low 4 bits of the scale of group g
#   [8:136]  qs        weight e = 32g + 16n + l (n < 2, l < 16) is nibble n of qs[16g + l]
#   w = d * (scale_g - 32) * KVALUES[q]
class IQ4_XSLayout(Layout):
    block_elems, block_bytes, group = 256, 136, 0

    def groups(self, em, p):
        b = em.b
        d = em.f16(p, 0)
        scales_h = b.zext(em.load(p, 2, I16), I32)
        out = []
        for g in range(8):
            if g % 2 == 0:  # two groups' codes at a time: one 64-lane portable lookup
                q = [em.s8f(v) for v in _codes(em, p, 8 + 16 * g, 2)]
            k = 2 * (g % 2)
            scale = _xs_scale(em, p, scales_h, g)
            out.append(Group(32 * g, q[k : k + 2], em.fmul(d, b.sitofp(scale, F32))))
        return out

    def int_block(self, em, p):  # ggml_vec_dot_iq4_xs_q8_K
        scales_h = em.b.zext(em.load(p, 2, I16), I32)
        parts = []
        for g in range(8):
            if g % 2 == 0:
                q = _codes(em, p, 8 + 16 * g, 2)
            k = 2 * (g % 2)
            sc = em.splat_scale(_xs_scale(em, p, scales_h, g))
            parts.append(IntPart(32 * g, em.join(q[k], q[k + 1]), True, sc))
        return IntBlock(em.f16(p, 0), parts)

    rp_fields = ((0, 2, 0), (2, 2, 0), (4, 4, 0), (8, 128, 4))  # d, scales_h, scales_l, qs
    rp_sum_group = 32

    def rp_block(self, em, field, R):
        b = em.b
        vi, vc = ir.VectorType(I32, R), rp_const(R)
        sh = b.zext(
            em.load(field(1), 0, ir.VectorType(I16, R), align=2), vi
        )  # lane: its row's scales_h
        sl = b.bitcast(
            em.load(field(2), 0, ir.VectorType(ir.IntType(8), 4 * R)), vi
        )  # scales_l as a u32
        groups = []
        for g in range(8):  # group g: qs chunks 4g .. 4g + 3, laid out as an IQ4_NL block's
            parts = rp_nibble_parts(
                em, field(3), R, lambda q: em.lut16_wide(KVALUES, q), True, 4 * g, 32 * g
            )
            lo = b.and_(b.lshr(sl, vc(4 * g)), vc(15))
            hi = b.and_(b.lshr(sh, vc(2 * g)), vc(3))
            groups.append(
                RpGroup(parts, scale=b.sub(b.or_(lo, b.shl(hi, vc(4))), vc(32)), sums=(g,))
            )
        return RpBlock(em.rp_f16(field(0), R), groups)
