"""K-quants: 256-weight super-blocks with per-sub-block scales (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K).

Each layout splits a super-block into groups of 32 (Q4_K, Q5_K) or 16 (Q2_K, Q3_K, Q6_K)
weights sharing one scale d_g and offset c_g, so w = d_g * q + c_g with q a small unsigned
integer. e (0..255) is the weight index inside the super-block. The layouts follow
ggml-common.h; gguf-py's numpy dequantisers are the executable spec the tests compare with.
The layouts only: the kernels are generated into generated/q2_k.py ... q6_k.py by codegen.py.
"""

from __future__ import annotations

from llvmlite import ir

from ._ir import (
    F32,
    I32,
    V16F,
    V32I8,
    Group,
    IntBlock,
    IntPart,
    Layout,
    RpBlock,
    RpGroup,
    RpPart,
    rp_const,
)


def _c(v):
    return ir.Constant(I32, v)


def _idx(lanes):
    """Constant lane-index vector for shufflevector."""
    lanes = list(lanes)
    return ir.Constant(ir.VectorType(I32, len(lanes)), lanes)


def _k4_scale_min(em, p, off, j):
    """_k4_scale_min_int as floats."""
    sc, mn = _k4_scale_min_int(em, p, off, j)
    return em.b.uitofp(sc, F32), em.b.uitofp(mn, F32)


def _k4_mins16(em, p, off):
    """The 8 mins of a Q4_K/Q5_K super-block as <16 x float>, each twice (lanes 2j, 2j + 1:
    the two Q8_K bsums of 16 weights in sub-block j)."""
    v = ir.Constant(V16F, None)
    for j in range(8):
        mn = em.b.uitofp(_k4_scale_min_int(em, p, off, j)[1], F32)
        for k in (2 * j, 2 * j + 1):
            v = em.b.insert_element(v, mn, _c(k))
    return v


def _k4_scale_min_int(em, p, off, j):
    """6-bit scale and min (i32) of sub-block j (0..7), packed in the 12 bytes at p + off:

    bytes 0..3 : low 6 bits = scale j=0..3, top 2 bits = bits 4..5 of scale j=4..7
    bytes 4..7 : low 6 bits = min   j=0..3, top 2 bits = bits 4..5 of min   j=4..7
    bytes 8..11: low nibble = bits 0..3 of scale j=4..7, high nibble = bits 0..3 of min j=4..7
    """
    return _k4_unpack(em.b, lambda k: em.u8(p, off + k), j, _c)


def _k4_unpack(b, u, j, c):
    """Scale and min of sub-block j from the packed bytes u(k) (k < 12: i32 values or vectors
    of them, one lane per interleaved row); c(v) the constant v of u's type."""
    if j < 4:
        sc = b.and_(u(j), c(63))
        mn = b.and_(u(j + 4), c(63))
    else:
        sc = b.or_(b.and_(u(j + 4), c(15)), b.shl(b.lshr(u(j - 4), c(6)), c(4)))
        mn = b.or_(b.lshr(u(j + 4), c(4)), b.shl(b.lshr(u(j), c(6)), c(4)))
    return sc, mn


# Q2_K super-block (84 bytes):
#   [0:16]   scales  byte g: low nibble = scale of group g (16 weights), high nibble = its min
#   [16:80]  qs      2-bit weights: e = h*128 + s*32 + l (h < 2, s < 4, l < 32) is bits 2s..2s+1
#                    of qs[h*32 + l]
#   [80:82]  d       f16 super-scale for the scales
#   [82:84]  dmin    f16 super-scale for the mins
#   w = d * scale_g * q - dmin * min_g, g = e // 16
class Q2_KLayout(Layout):
    block_elems, block_bytes, group = 256, 84, 16

    def groups(self, em, p):
        b = em.b
        # All 16 group scales and mins at once, one lane per group.
        sb = em.bytes16(p, 0)
        dsc = em.fmul(em.splat(em.f16(p, 80)), em.u8f(em.nib_lo(sb)))
        dmn = em.fmul(em.splat(em.f16(p, 82)), em.u8f(em.nib_hi(sb)))
        dmn = em.fmul(dmn, em.splat(em.fconst(-1.0)))
        out = []
        for h in range(2):
            for k in range(2):
                q8 = em.words16(p, 16 + h * 32 + 16 * k)
                for s in range(4):
                    e0 = h * 128 + s * 32 + 16 * k
                    g = _c(e0 // 16)
                    q = em.u8f(em.bits(q8, 2 * s, 3))
                    out.append(Group(e0, [q], b.extract_element(dsc, g), b.extract_element(dmn, g)))
        return out

    def int_block(self, em, p):  # ggml_vec_dot_q2_K_q8_K
        sb = em.bytes16(p, 0)
        sc = em.nib_lo(sb)
        parts = []
        for h in range(2):
            qa, qb = em.bytes16(p, 16 + h * 32), em.bytes16(p, 32 + h * 32)
            for s in range(4):
                e0 = h * 128 + s * 32
                w = em.join(em.bits(qa, 2 * s, 3), em.bits(qb, 2 * s, 3))
                parts.append(IntPart(e0, w, False, em.pair_scales(sc, e0 // 16, False)))
        return IntBlock(em.f16(p, 80), parts, mins=em.u8f(em.nib_hi(sb)), dmin=em.f16(p, 82))

    rp_fields = ((80, 2, 0), (82, 2, 0), (0, 16, 1), (16, 64, 4))  # d, dmin, scales, qs
    rp_sum_group = 16

    def rp_block(self, em, field, R):
        b = em.b
        vc = rp_const(R)
        sb = [em.rp_byte(field(2), g, R) for g in range(16)]  # lane: scales[g] of its row
        parts: dict[int, list] = {g: [] for g in range(16)}
        for h in range(2):
            for i in range(8):  # qs bytes h*32 + 4i .. + 3: weights h*128 + s*32 + 4i .. + 3
                qs = em.rp_chunk(field(3), 8 * h + i, R)
                for s in range(4):
                    e0 = h * 128 + s * 32 + 4 * i
                    parts[e0 // 16].append(RpPart(e0, em.bits(qs, 2 * s, 3), False))
        groups = [RpGroup(parts[g], scale=b.and_(sb[g], vc(15))) for g in range(16)]
        mins = [(b.lshr(sb[g], vc(4)), (g,)) for g in range(16)]
        return RpBlock(em.rp_f16(field(0), R), groups, mins=mins, dmin=em.rp_f16(field(1), R))


# Q3_K super-block (110 bytes):
#   [0:32]    hmask   high bit of e = h*128 + s*32 + l is bit (4h + s) of hmask[l]
#   [32:96]   qs      low 2 bits of e are bits 2s..2s+1 of qs[h*32 + l]
#   [96:108]  scales  16 6-bit signed scales (value - 32): low 4 bits of scale g are nibble
#                     (g // 8) of byte g % 8, high 2 bits are bits 2*(g // 4).. of byte 8 + g % 4
#   [108:110] d       f16 super-scale
#   w = d * (scale_g - 32) * (q - 4) with q = low2 | high << 2 (so a clear high bit means -4);
#   q - 4 is formed in bytes and read as signed, so no offset term
class Q3_KLayout(Layout):
    block_elems, block_bytes, group = 256, 110, 0

    def groups(self, em, p):
        b = em.b
        dsc = em.fmul(em.splat(em.f16(p, 108)), em.s8f(self._scales(em, p)))
        out = []
        for k in range(2):
            hm = em.bytes16(p, 16 * k)
            for h in range(2):
                q8 = em.bytes16(p, 32 + h * 32 + 16 * k)
                for s in range(4):
                    e0 = h * 128 + s * 32 + 16 * k
                    q = em.s8f(self._codes(em, hm, q8, h, s))
                    out.append(Group(e0, [q], b.extract_element(dsc, _c(e0 // 16))))
        return out

    def int_block(self, em, p):  # ggml_vec_dot_q3_K_q8_K
        sc = self._scales(em, p)
        hm = [em.bytes16(p, 0), em.bytes16(p, 16)]
        parts = []
        for h in range(2):
            q8 = [em.bytes16(p, 32 + h * 32), em.bytes16(p, 48 + h * 32)]
            for s in range(4):
                e0 = h * 128 + s * 32
                w = em.join(*(self._codes(em, hm[k], q8[k], h, s) for k in range(2)))
                parts.append(IntPart(e0, w, True, em.pair_scales(sc, e0 // 16, True)))
        return IntBlock(em.f16(p, 108), parts)

    rp_fields = ((108, 2, 0), (96, 12, 1), (0, 32, 4), (32, 64, 4))  # d, scales, hmask, qs
    rp_sum_group = 16

    def rp_block(self, em, field, R):
        b = em.b
        vc = rp_const(R)
        u = [em.rp_byte(field(1), k, R) for k in range(12)]  # lane: scales byte k of its row
        parts: dict[int, list] = {g: [] for g in range(16)}
        for i in range(8):  # weights h*128 + s*32 + 4i .. + 3 (l = 4i .. 4i + 3)
            hm = em.rp_chunk(field(2), i, R)
            for h in range(2):
                qs = em.rp_chunk(field(3), 8 * h + i, R)
                for s in range(4):
                    e0 = h * 128 + s * 32 + 4 * i
                    q = b.or_(em.bits(qs, 2 * s, 3), em.shl(em.bits(hm, 4 * h + s, 1), 2))
                    parts[e0 // 16].append(RpPart(e0, q, False))  # q - 4 through the offset
        groups = []
        for g in range(16):
            lo = b.and_(b.lshr(u[g % 8], vc(4 * (g // 8))), vc(15))
            hi = b.and_(b.lshr(u[8 + g % 4], vc(2 * (g // 4))), vc(3))
            scale = b.sub(b.or_(lo, b.shl(hi, vc(4))), vc(32))
            groups.append(RpGroup(parts[g], scale=scale, offset=4, sums=(g,)))
        return RpBlock(em.rp_f16(field(0), R), groups)

    @staticmethod
    def _scales(em, p):
        """All 16 scales minus 32 as <16 x i8>, lane g = scale of group g."""
        b = em.b
        v8 = em.load(p, 96, ir.VectorType(ir.IntType(8), 8))
        lo4 = b.shuffle_vector(
            b.and_(v8, ir.Constant(v8.type, [15] * 8)),
            b.lshr(v8, ir.Constant(v8.type, [4] * 8)),
            _idx(range(16)),
        )
        v4 = em.load(p, 104, ir.VectorType(ir.IntType(8), 4))
        hi2 = b.shuffle_vector(v4, v4, _idx([0, 1, 2, 3] * 4))
        hi2 = b.and_(b.lshr(hi2, em.vconst8([2 * (g // 4) for g in range(16)])), em.vconst8(3))
        return em.sub8(b.or_(lo4, em.shl(hi2, 4)), 32)

    @staticmethod
    def _codes(em, hm, q8, h, s):
        """Signed codes q - 4 (<16 x i8>) of 16 weights from their hmask and qs bytes."""
        hbit = em.shl(em.bits(hm, 4 * h + s, 1), 2)
        return em.sub8(em.b.or_(em.bits(q8, 2 * s, 3), hbit), 4)


# Q4_K super-block (144 bytes):
#   [0:2]    d       f16 super-scale for the scales
#   [2:4]    dmin    f16 super-scale for the mins
#   [4:16]   scales  8 packed 6-bit (scale, min) pairs, see _k4_scale_min
#   [16:144] qs      e = j*64 + n*32 + l (j < 4, n < 2, l < 32) is nibble n of qs[j*32 + l]
#   w = d * scale_g * q - dmin * min_g, g = e // 32
class Q4_KLayout(Layout):
    block_elems, block_bytes, group = 256, 144, 32

    def groups(self, em, p):
        d, dmin = em.f16_pair(p, 0)
        out = []
        for j in range(4):
            qa, qb = em.words16(p, 16 + 32 * j), em.words16(p, 32 + 32 * j)
            for n in range(2):
                g = 2 * j + n
                sc, mn = _k4_scale_min(em, p, 4, g)
                if n == 0:
                    q = [em.u8f(em.nib_lo(qa)), em.u8f(em.nib_lo(qb))]
                else:
                    q = [em.u8f(em.nib_hi(qa)), em.u8f(em.nib_hi(qb))]
                out.append(
                    Group(32 * g, q, em.fmul(d, sc), em.fmul(em.fmul(dmin, mn), em.fconst(-1.0)))
                )
        return out

    def int_block(self, em, p):  # ggml_vec_dot_q4_K_q8_K
        parts = []
        for j in range(4):
            qa, qb = em.bytes16(p, 16 + 32 * j), em.bytes16(p, 32 + 32 * j)
            for n in range(2):
                g = 2 * j + n
                nib = em.nib_lo if n == 0 else em.nib_hi
                sc = em.splat_scale(_k4_scale_min_int(em, p, 4, g)[0])
                parts.append(IntPart(32 * g, em.join(nib(qa), nib(qb)), False, sc))
        return IntBlock(em.f16(p, 0), parts, mins=_k4_mins16(em, p, 4), dmin=em.f16(p, 2))

    rp_fields = ((0, 2, 0), (2, 2, 0), (4, 12, 1), (16, 128, 4))  # d, dmin, scales, qs
    rp_sum_group = 16

    def rp_block(self, em, field, R):
        return _rp_k4(em, field, R, 3, lambda g, i, q: q)


def _rp_k4(em, field, R, qs, code):
    """An interleaved Q4_K / Q5_K super-block: fields 0, 1, 2 d, dmin and the packed scales
    (1-byte chunks), field qs the nibbles (4-byte chunks); code(g, i, q) the codes of
    sub-block g's weights 4i..4i+3 from their nibbles q (Q5_K adds its fifth bits)."""
    sm = [_k4_unpack(em.b, lambda k: em.rp_byte(field(2), k, R), j, rp_const(R)) for j in range(8)]
    groups = []
    for g in range(8):  # sub-block g = 2j + n: nibble n of qs[32j .. 32j + 31]
        j, n = divmod(g, 2)
        nib = em.nib_lo if n == 0 else em.nib_hi
        parts = [
            RpPart(32 * g + 4 * i, code(g, i, nib(em.rp_chunk(field(qs), 8 * j + i, R))), False)
            for i in range(8)
        ]
        groups.append(RpGroup(parts, scale=sm[g][0]))
    mins = [(sm[g][1], (2 * g, 2 * g + 1)) for g in range(8)]
    return RpBlock(em.rp_f16(field(0), R), groups, mins=mins, dmin=em.rp_f16(field(1), R))


# Q5_K super-block (176 bytes):
#   [0:2]     d       f16 super-scale for the scales
#   [2:4]     dmin    f16 super-scale for the mins
#   [4:16]    scales  8 packed 6-bit (scale, min) pairs, see _k4_scale_min
#   [16:48]   qh      5th bit (value 16) of e = g*32 + l is bit g of qh[l]
#   [48:176]  qs      low 4 bits as in Q4_K: e = j*64 + n*32 + l is nibble n of qs[j*32 + l]
#   w = d * scale_g * q - dmin * min_g, g = e // 32
class Q5_KLayout(Layout):
    block_elems, block_bytes, group = 256, 176, 32

    def groups(self, em, p):
        b = em.b
        d, dmin = em.f16_pair(p, 0)
        hs = em.load(p, 16, V32I8)  # the high bits of both 16-byte halves: 32-byte byte ops
        out = []
        for j in range(4):
            qs = em.load(p, 48 + 32 * j, V32I8)
            for n in range(2):
                g = 2 * j + n
                sc, mn = _k4_scale_min(em, p, 4, g)
                lo = em.nib_lo(qs) if n == 0 else em.nib_hi(qs)
                q = [em.u8f(v) for v in em.halves(b.or_(lo, em.shl(em.bits(hs, g, 1), 4)))]
                out.append(
                    Group(32 * g, q, em.fmul(d, sc), em.fmul(em.fmul(dmin, mn), em.fconst(-1.0)))
                )
        return out

    def int_block(self, em, p):  # ggml_vec_dot_q5_K_q8_K
        b = em.b
        ha, hb = em.bytes16(p, 16), em.bytes16(p, 32)
        parts = []
        for j in range(4):
            qa, qb = em.bytes16(p, 48 + 32 * j), em.bytes16(p, 64 + 32 * j)
            for n in range(2):
                g = 2 * j + n
                nib = em.nib_lo if n == 0 else em.nib_hi
                w = em.join(
                    b.or_(nib(qa), em.shl(em.bits(ha, g, 1), 4)),
                    b.or_(nib(qb), em.shl(em.bits(hb, g, 1), 4)),
                )
                sc = em.splat_scale(_k4_scale_min_int(em, p, 4, g)[0])
                parts.append(IntPart(32 * g, w, False, sc))
        return IntBlock(em.f16(p, 0), parts, mins=_k4_mins16(em, p, 4), dmin=em.f16(p, 2))

    rp_fields = (
        (0, 2, 0),
        (2, 2, 0),
        (4, 12, 1),
        (16, 32, 4),
        (48, 128, 4),
    )  # d, dmin, scales, qh, qs
    rp_sum_group = 16

    def rp_block(self, em, field, R):
        b = em.b
        qh = [em.rp_chunk(field(3), i, R) for i in range(8)]  # lane: qh[4i .. 4i + 3] of its row
        return _rp_k4(em, field, R, 4, lambda g, i, q: b.or_(q, em.shl(em.bits(qh[i], g, 1), 4)))


# Q6_K super-block (210 bytes):
#   [0:128]   ql      low 4 bits of e = h*128 + c*32 + l (h < 2, c < 4, l < 32) are nibble c // 2
#                     of ql[h*64 + (c % 2)*32 + l]
#   [128:192] qh      high 2 bits of e are bits 2c..2c+1 of qh[h*32 + l]
#   [192:208] scales  16 signed bytes, one per group of 16
#   [208:210] d       f16 super-scale
#   w = d * scale_g * (q - 32), g = e // 16 (q - 32 formed in bytes, read as signed)
class Q6_KLayout(Layout):
    block_elems, block_bytes, group = 256, 210, 0

    def groups(self, em, p):
        b = em.b
        # All 16 group scales at once: d * (float)scales[0:16], one lane per group.
        dsc = em.fmul(em.splat(em.f16(p, 208)), em.s8f(em.bytes16(p, 192)))
        # The codes of 32 weights (both k halves) at once: the byte operations then run on
        # 32-byte vectors, half the instructions of two 16-byte passes. Groups keep their
        # order (h, k, c), which decides the accumulators and so the rounding.
        codes = {}
        for h in range(2):
            qh = em.load(p, 128 + h * 32, V32I8)
            for c in range(4):
                ql = em.load(p, h * 64 + (c % 2) * 32, V32I8)
                lo = em.nib_lo(ql) if c < 2 else em.nib_hi(ql)
                codes[h, c] = em.halves(em.sub8(b.or_(lo, em.shl(em.bits(qh, 2 * c, 3), 4)), 32))
        out = []
        for h in range(2):
            for k in range(2):
                for c in range(4):
                    e0 = h * 128 + c * 32 + 16 * k
                    q = em.s8f(codes[h, c][k])
                    out.append(Group(e0, [q], b.extract_element(dsc, _c(e0 // 16))))
        return out

    def int_block(self, em, p):  # ggml_vec_dot_q6_K_q8_K
        b = em.b
        sc = em.bytes16(p, 192)
        parts = []
        for h in range(2):
            qh = [em.bytes16(p, 128 + h * 32 + 16 * k) for k in range(2)]
            for c in range(4):
                e0 = h * 128 + c * 32
                codes = []
                for k in range(2):
                    ql = em.bytes16(p, h * 64 + (c % 2) * 32 + 16 * k)
                    lo = em.nib_lo(ql) if c < 2 else em.nib_hi(ql)
                    codes.append(em.sub8(b.or_(lo, em.shl(em.bits(qh[k], 2 * c, 3), 4)), 32))
                parts.append(IntPart(e0, em.join(*codes), True, em.pair_scales(sc, e0 // 16, True)))
        return IntBlock(em.f16(p, 208), parts)

    rp_fields = ((208, 2, 0), (192, 16, 1), (0, 128, 4), (128, 64, 4))  # d, scales, ql, qh
    rp_sum_group = 16

    def rp_block(self, em, field, R):
        b = em.b
        parts: dict[int, list] = {s: [] for s in range(16)}
        for h in range(2):
            for i in range(8):  # weights h*128 + c*32 + 4i .. + 3, c < 4
                qh = em.rp_chunk(field(3), 8 * h + i, R)
                ql = [em.rp_chunk(field(2), 16 * h + 8 * k + i, R) for k in range(2)]
                for c in range(4):
                    lo = em.nib_lo(ql[c % 2]) if c < 2 else em.nib_hi(ql[c % 2])
                    e0 = h * 128 + c * 32 + 4 * i
                    parts[e0 // 16].append(
                        RpPart(e0, b.or_(lo, em.shl(em.bits(qh, 2 * c, 3), 4)), False)
                    )
        groups = [
            RpGroup(parts[s], scale=em.rp_byte(field(1), s, R, signed=True), offset=32, sums=(s,))
            for s in range(16)
        ]
        return RpBlock(em.rp_f16(field(0), R), groups)
