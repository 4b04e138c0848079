"""Hand-written LLVM vector IR for the per-row inner loops, exposed to numba as intrinsics.

Why IR: numba gives LLVM scalar loops, and LLVM vectorises a 32-element block loop badly (it
fully unrolls the block, then vectorises the *outer* block loop with gathers: ~4 GMAC/s). Here
each quant type only describes how to turn one packed block into groups of 16-float vectors;
the generic emitters below build, for any type:

    row_dot(raw, r, x, xs, T)     -> T float32 dot products of packed row r with x[0..T)
    row_dequant(raw, r, out, o)   -> out[o, :] = float32 weights of row r

Every weight is written w = d_g * q + c_g, where q is a small integer (held as float),
d_g one scale per group of G (16 or 32) weights and c_g an optional per-group offset. So
    dot(w, x) = sum_g d_g * (q_g . x_g) + sum_g c_g * xsum_g
with xsum_g the sum of x over group g (computed once per mat-vec, shared by all rows; types
whose codes are centred in bytes, like Q4_0's q - 8, need none). The vector part accumulates
in <16 x float> registers across the whole row (two accumulators, alternating blocks or
groups), with a single horizontal sum at the end of the row.

Portable LLVM operations are used (vector zext/sitofp/fma, a `half` -> float extension,
llvm.prefetch), so the same code runs (slower) on AVX2-only machines, with two exceptions chosen
from the target's features when the kernel is compiled: F16C's half conversion, and SSSE3's
pshufb for the 16-entry tables of the non-linear types (IQ4_NL, IQ4_XS, MXFP4; Emit.lut16).
Each has a portable fallback (integer arithmetic; a tree of vector selects) that LLVM lowers on
any target. LLVM targets the host CPU (numba's default, or NUMBA_CPU_NAME/NUMBA_CPU_FEATURES),
e.g. AVX-512 on these EPYCs. GGSTATION_PORTABLE_LUT=1 (engine/jit.py) forces the portable table
lookup and the portable int8 dot, for tests and benchmarks.

Decode uses a second form, llama.cpp's (make_row_dot_i8): x quantised once per mat-vec to the
type's vec_dot_type (_q8.py), each Layout's int_block() giving its codes as <32 x i8> and its
sub-block scales as integers (IntBlock), integer dots per block (Emit.idot: pmaddubsw +
pmaddwd where the target has AVX2, vpdpbusd for unscaled parts with VNNI, chosen at compile
time like pshufb; otherwise portable widening multiplies, from which LLVM forms pmaddwd but not
pmaddubsw, nor vpdpbusd), float scales per block as ggml's vec_dot_* apply them. It gives
llama.cpp's numerics (tests/compare_int8_llama_cpp.py) and, one core, 1.3-2.6x the float
form's GMAC/s on an AVX2 target and 1.1-1.9x on AVX-512 with VNNI for one token (tests/
bench_quants.py --int8-vs-float). With AVX-512 (AVX512BW) the integer dots run on two
32-weight blocks or parts at once (512-bit vpdpbusd / pmaddubsw), which halves what each token
adds to a row: several slots decoding together cost less per token (make_row_dot_i8). The
float form (make_row_dot) is the oracle and serves GGSTATION_NO_INT8=1 and the dense types.

Types whose Layout has a row-interleaved form (rp_fields, rp_block) decode instead through
make_group_dot_i8, on a copy of the weights with R rows side by side (_kern.repack_rows): one
integer dot serves R rows, the scales are vectors, there are no horizontal sums. It runs the
int8 path (x in llama.cpp's Q8 blocks) and the default one (x in two 8-bit planes a block,
_q8.quantize_planes: float-grade at integer speed).

Caching: numba keys a cached kernel on its own module's source, not on this file, so the
generated kernel modules (engine/quants/generated/) embed a digest of this file, _kern.py and
their layout module; after editing any of them run `python -m engine.quants.codegen` (until
then those kernels compile uncached, with a warning: engine/jit.py, generated_kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .. import jit

F32 = ir.FloatType()
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
V16F = ir.VectorType(F32, 16)
V16I8 = ir.VectorType(I8, 16)
V16I16 = ir.VectorType(I16, 16)
V16I32 = ir.VectorType(I32, 16)
V16H = ir.VectorType(ir.HalfType(), 16)
V32I8 = ir.VectorType(I8, 32)
V32I16 = ir.VectorType(I16, 32)
V64I8 = ir.VectorType(I8, 64)
V8I32 = ir.VectorType(I32, 8)
V8F = ir.VectorType(F32, 8)
V2F = ir.VectorType(F32, 2)


def _fast(ins):
    ins.flags.append("fast")
    return ins


def _target_features(context) -> str:
    """The LLVM feature string ("+avx2,+f16c,...") of the code being generated."""
    try:
        return str(context.codegen()._tm_features)
    except Exception:  # pragma: no cover - other numba codegens
        return ""


def _use_pshufb(feats: str) -> bool:
    """Whether table lookups may use SSSE3's pshufb (not under GGSTATION_PORTABLE_LUT)."""
    return "+ssse3" in feats and not jit.PORTABLE_LUT


def _use_avx2(feats: str) -> bool:
    """Whether int8 dots may use AVX2's pmaddubsw/pmaddwd (not under GGSTATION_PORTABLE_LUT)."""
    return "+avx2" in feats and not jit.PORTABLE_LUT


def _use_vnni(feats: str) -> bool:
    """Whether unscaled int8 dots may use vpdpbusd (AVX-VNNI, or AVX512-VNNI with AVX512VL)."""
    vnni = "+avxvnni" in feats or "+avx512vnni" in feats and "+avx512vl" in feats
    return vnni and _use_avx2(feats)


def _use_avx512(feats: str) -> bool:
    """Whether int8 dots may run on 512-bit vectors (AVX512BW's pmaddubsw/pmaddwd, and
    vpdpbusd when AVX512-VNNI is there too): two 32-byte blocks or parts per instruction."""
    return "+avx512bw" in feats and _use_avx2(feats)


def make_emit(context, builder: ir.IRBuilder) -> Emit:
    """An Emit for `builder` that uses what the compile target offers (F16C, pshufb, AVX2,
    VNNI, AVX-512)."""
    feats = _target_features(context)
    avx512 = _use_avx512(feats)
    return Emit(
        builder,
        f16c="+f16c" in feats,
        pshufb=_use_pshufb(feats),
        avx2=_use_avx2(feats),
        vnni=_use_vnni(feats),
        avx512=avx512,
        vnni512=avx512 and _use_vnni(feats) and "+avx512vnni" in feats,
    )


class Emit:
    """IR-building helpers bound to one builder; offsets are byte offsets from `base` (i8*)."""

    def __init__(
        self,
        builder: ir.IRBuilder,
        f16c: bool = False,
        pshufb: bool = False,
        avx2: bool = False,
        vnni: bool = False,
        avx512: bool = False,
        vnni512: bool = False,
    ):
        self.b = builder
        self.f16c = f16c
        self.pshufb = pshufb
        self.avx2 = avx2
        self.vnni = vnni
        self.avx512 = avx512  # idot takes 64-byte operands (two blocks or parts) as one
        self.vnni512 = vnni512  # ... and those without scales go through one 512-bit vpdpbusd

    def half_to_float(self, h):
        """IEEE half bits (i16 or <n x i16>) -> float / <n x float>.

        With F16C this is one vcvtph2ps. Without it LLVM would call __extendhfsf2, which numba
        cannot link (the process aborts), so convert with integer arithmetic instead.
        """
        b = self.b
        vec = isinstance(h.type, ir.VectorType)
        n = h.type.count if vec else 1
        fty = ir.VectorType(F32, n) if vec else F32
        if self.f16c:
            hty = ir.VectorType(ir.HalfType(), n) if vec else ir.HalfType()
            return b.fpext(b.bitcast(h, hty), fty)
        ity = ir.VectorType(I32, n) if vec else I32

        def c(v):
            return ir.Constant(ity, [v] * n if vec else v)

        w = b.zext(h, ity)
        sign = b.shl(b.and_(w, c(0x8000)), c(16))
        em = b.and_(w, c(0x7FFF))
        # Normal and subnormal halves: shift into a float's bits, rescale by 2^112.
        f = b.fmul(
            b.bitcast(b.shl(em, c(13)), fty), ir.Constant(fty, [2.0**112] * n if vec else 2.0**112)
        )
        bits = b.bitcast(f, ity)
        infnan = b.icmp_unsigned(">=", em, c(0x7C00))
        bits = b.select(infnan, b.or_(b.shl(em, c(13)), c(0x7F800000)), bits)
        return b.bitcast(b.or_(bits, sign), fty)

    # --- loads -----------------------------------------------------------------------------
    def ptr(self, base, off):
        if isinstance(off, int):
            off = ir.Constant(I64, off)
        return self.b.gep(base, [off])

    def load(self, base, off, ty, align=1):
        p = self.b.bitcast(self.ptr(base, off), ty.as_pointer())
        return self.b.load(p, align=align)

    def f16(self, base, off):
        """One little-endian IEEE half at base+off, as float."""
        return self.half_to_float(self.load(base, off, I16))

    def u8(self, base, off):
        """One byte, zero-extended to i32."""
        return self.b.zext(self.load(base, off, I8), I32)

    def i8(self, base, off):
        return self.b.sext(self.load(base, off, I8), I32)

    def bytes16(self, base, off):
        return self.load(base, off, V16I8)

    def words16(self, base, off):
        """16 bytes at base+off, each zero-extended to an i32 lane (<16 x i32>).

        Nibbles and bit fields are then cut from the i32 lanes: the byte-to-lane widening is
        one load-folded vpmovzxbd per 8 bytes on AVX2, where cutting them from the bytes first
        costs a shuffle per 4 of them (pshufd + vpmovzxbd from a register), and AVX2's shuffle
        port was the float kernels' bottleneck."""
        return self.b.zext(self.bytes16(base, off), V16I32)

    def f16_pair(self, base, off):
        """The two adjacent halves at base+off as floats (one vcvtph2ps for both with F16C)."""
        if not self.f16c:
            return self.f16(base, off), self.f16(base, off + 2)
        v = self.b.fpext(
            self.b.bitcast(
                self.load(base, off, ir.VectorType(I16, 2)), ir.VectorType(ir.HalfType(), 2)
            ),
            V2F,
        )
        return (
            self.b.extract_element(v, ir.Constant(I32, 0)),
            self.b.extract_element(v, ir.Constant(I32, 1)),
        )

    def rp_f16(self, base, R):
        """R little-endian halves at base (one per interleaved row) as <R x float>."""
        return self.half_to_float(self.load(base, 0, ir.VectorType(I16, R), align=2))

    def rp_chunk(self, base, v, R):
        """Chunk vector v of a field of R rows interleaved in 4-byte chunks: <4R x i8>, lane i
        (bytes 4i..4i+3) row i's bytes 4v..4v+3 of the field."""
        return self.load(base, 4 * R * v, ir.VectorType(I8, 4 * R))

    def rp_bits16(self, words, k, R):
        """Bits k..k+3 of each i32 lane of `words` (<R x i32>: one 32-bit field per row) as
        the four bytes of the lane, 16 where the bit is set, else 0 (<4R x i8>): a fifth bit
        beside four nibble codes. (t * 0x00204081 puts bit j of a 4-bit t at bit 8j.)"""
        b, vi = self.b, words.type
        t = b.and_(b.lshr(words, ir.Constant(vi, [k] * R)), ir.Constant(vi, [15] * R))
        spread = b.and_(
            b.mul(t, ir.Constant(vi, [0x00204081] * R)), ir.Constant(vi, [0x01010101] * R)
        )
        return b.bitcast(b.shl(spread, ir.Constant(vi, [4] * R)), ir.VectorType(I8, 4 * R))

    def rp_byte(self, base, k, R, signed=False):
        """Byte k of each of R rows of a field interleaved byte by byte, as <R x i32>."""
        v = self.load(base, R * k, ir.VectorType(I8, R))
        ty = ir.VectorType(I32, R)
        return self.b.sext(v, ty) if signed else self.b.zext(v, ty)

    # --- vector ops ------------------------------------------------------------------------
    def splat(self, v, ty=V16F):
        u = ir.Constant(ty, None)
        u = self.b.insert_element(u, v, ir.Constant(I32, 0))
        return self.b.shuffle_vector(
            u, u, ir.Constant(ir.VectorType(I32, ty.count), [0] * ty.count)
        )

    def vconst8(self, values):
        return ir.Constant(V16I8, list(values) if hasattr(values, "__iter__") else [values] * 16)

    def vconst32(self, values):
        return ir.Constant(V16I32, list(values) if hasattr(values, "__iter__") else [values] * 16)

    def _vc(self, q, v):
        """The constant v in every lane of a vector of q's type (<16 x i8> or <16 x i32>)."""
        return ir.Constant(q.type, [v] * q.type.count)

    def nib_lo(self, q):
        return self.b.and_(q, self._vc(q, 15))

    def nib_hi(self, q):
        """High nibble of each byte (<16 x i8>) or of each zero-extended byte (words16)."""
        return self.b.lshr(q, self._vc(q, 4))

    def bits(self, q, shift, mask):
        """(q >> shift) & mask per lane."""
        if shift:
            q = self.b.lshr(q, self._vc(q, shift))
        return self.b.and_(q, self._vc(q, mask))

    def shl(self, q, k):
        return self.b.shl(q, self._vc(q, k))

    def u8f(self, q8):
        """Unsigned codes -> <16 x float>: <16 x i8>, or words16 lanes (whose small values the
        signed conversion takes as they are: one vcvtdq2ps per 8 lanes)."""
        if q8.type == V16I32:
            return self.b.sitofp(q8, V16F)
        return self.b.uitofp(q8, V16F)

    def s8f(self, q8):
        """Signed codes -> <16 x float>: <16 x i8> read as signed, or i32 lanes."""
        return self.b.sitofp(q8, V16F)

    def bit_bytes(self, word32, value):
        """Bit j of an i32 word -> byte j (j < 32) equal to `value` if set else 0; two <16 x i8>.

        (bitcast to <32 x i1> + select: one masked byte move on AVX-512BW.)
        """
        v32 = ir.VectorType(I8, 32)
        m = self.b.bitcast(word32, ir.VectorType(ir.IntType(1), 32))
        sel = self.b.select(m, ir.Constant(v32, [value] * 32), ir.Constant(v32, [0] * 32))
        lo = self.b.shuffle_vector(sel, sel, ir.Constant(ir.VectorType(I32, 16), list(range(16))))
        hi = self.b.shuffle_vector(
            sel, sel, ir.Constant(ir.VectorType(I32, 16), list(range(16, 32)))
        )
        return lo, hi

    def bit_words(self, base, off, set_value, clear_value=0):
        """The 32 bits of the little-endian word at base+off as two words16-style <16 x i32>
        (lane j of the first: `set_value` if bit j is set, else `clear_value`; of the second:
        bit 16 + j). A code's offset can ride in clear_value: Q5_0's q - 16 is then one add.

        Each byte of the word picks a row of a 256 x 8 table of lanes (8 KiB, stays in L1): two
        plain loads per 16 lanes, where testing the bits lane by lane costs three operations
        per 8 lanes (and AVX2's variable shifts cost the shuffle port)."""
        b = self.b
        mod = b.module
        name = f"_bit_words_{set_value}_{clear_value}".replace("-", "m")
        rows = ir.ArrayType(ir.ArrayType(I32, 8), 256)
        table = mod.globals.get(name)
        if table is None:
            table = ir.GlobalVariable(mod, rows, name=name)
            table.global_constant = True
            table.linkage = "internal"
            table.initializer = ir.Constant(
                rows,
                [
                    ir.Constant(
                        ir.ArrayType(I32, 8),
                        [set_value if (v >> i) & 1 else clear_value for i in range(8)],
                    )
                    for v in range(256)
                ],
            )
        v8 = ir.VectorType(I32, 8)
        parts = []
        for k in range(4):
            idx = b.zext(self.load(base, off + k, I8), I64)
            row = b.gep(table, [ir.Constant(I64, 0), idx, ir.Constant(I64, 0)])
            parts.append(b.load(b.bitcast(row, v8.as_pointer()), align=4))
        mask = ir.Constant(ir.VectorType(I32, 16), list(range(16)))
        return b.shuffle_vector(parts[0], parts[1], mask), b.shuffle_vector(
            parts[2], parts[3], mask
        )

    def lut16(self, table, idxs):
        """[table[i] for i in idxs]: each i a <16 x i8> of values 0..15, table 16 int8 constants.

        With SSSE3 each lookup is one 128-bit pshufb (the table in a register, the codes as its
        byte indices; measured faster here than joining them for the 256/512-bit forms).
        Elsewhere a tree of selects on the index bits (15 selects, 4 deep), which LLVM lowers
        on any target (blends on SSE2, bsl on NEON); it runs on the vectors joined 4 at a time,
        which LLVM splits to the target's width (one 512-bit blend per select on AVX-512).
        """
        if self.pshufb:
            fn = cgutils.get_or_insert_function(
                self.b.module, ir.FunctionType(V16I8, [V16I8, V16I8]), "llvm.x86.ssse3.pshuf.b.128"
            )
            return [self.b.call(fn, [self.vconst8(table), i]) for i in idxs]
        out = []
        for k in range(0, len(idxs), 4):
            part = idxs[k : k + 4]
            v = self._select_tree(table, self._concat(part))
            out += [
                self.b.shuffle_vector(
                    v, v, ir.Constant(ir.VectorType(I32, 16), list(range(16 * j, 16 * j + 16)))
                )
                for j in range(len(part))
            ]
        return out

    def lut16_wide(self, table, idx):
        """table[i] per byte of idx (<n x i8>, n a multiple of 16, values 0..15): the interleaved
        blocks' lookup of a whole 4R-byte chunk. One 256/512-bit pshufb (the table in every
        128-bit lane) where the target has it, else lut16 on the 16-byte pieces."""
        n = idx.type.count
        name = {32: "llvm.x86.avx2.pshuf.b", 64: "llvm.x86.avx512.pshuf.b.512"}.get(n)
        if self.pshufb and name and (self.avx512 if n == 64 else self.avx2):
            ty = ir.VectorType(I8, n)
            fn = cgutils.get_or_insert_function(self.b.module, ir.FunctionType(ty, [ty, ty]), name)
            return self.b.call(fn, [ir.Constant(ty, list(table) * (n // 16)), idx])
        pieces = [
            self.b.shuffle_vector(
                idx, idx, ir.Constant(ir.VectorType(I32, 16), list(range(k, k + 16)))
            )
            for k in range(0, n, 16)
        ]
        return self._concat(self.lut16(table, pieces))

    def _concat(self, vs):
        """Vectors of equal length, end to end (padded with copies of the first to 2^k)."""
        while len(vs) & (len(vs) - 1):
            vs = [*vs, vs[0]]
        while len(vs) > 1:
            n = 2 * vs[0].type.count
            mask = ir.Constant(ir.VectorType(I32, n), list(range(n)))
            vs = [self.b.shuffle_vector(vs[i], vs[i + 1], mask) for i in range(0, len(vs), 2)]
        return vs[0]

    def _select_tree(self, table, idx):
        """table[idx] per lane of an <n x i8> idx, portably: at level k a select on index bit k
        halves the candidates (table values as constant vectors)."""
        b, n = self.b, idx.type.count
        vty = ir.VectorType(I8, n)

        def const(v):
            return ir.Constant(vty, [v] * n)

        level = [const(v) for v in table]
        bit = 1
        while len(level) > 1:
            m = b.icmp_unsigned("!=", b.and_(idx, const(bit)), const(0))
            level = [b.select(m, level[i + 1], level[i]) for i in range(0, len(level), 2)]
            bit <<= 1
        return level[0]

    def e8m0_half(self, base, off):
        """The E8M0 byte at base+off as float, halved (2^(e - 128)), as ggml_e8m0_to_fp32_half.

        e < 2 give the subnormals 2^-128 and 2^-127; e = 255 gives 2^127 (no NaN code).
        """
        return self.e8m0_half_of(self.u8(base, off))

    def e8m0_half_of(self, e):
        """e8m0_half of e: an i32, or an <R x i32> (one E8M0 byte per interleaved row)."""
        b = self.b
        ty = e.type

        def c(v):
            return (
                ir.Constant(ty, [v] * ty.count)
                if isinstance(ty, ir.VectorType)
                else ir.Constant(ty, v)
            )

        small = b.shl(c(0x00200000), b.and_(e, c(1)))
        normal = b.shl(b.sub(e, c(1)), c(23))
        bits = b.select(b.icmp_unsigned("<", e, c(2)), small, normal)
        fty = ir.VectorType(F32, ty.count) if isinstance(ty, ir.VectorType) else F32
        return b.bitcast(bits, fty)

    def sub8(self, q, k):
        """q - k: on <16 x i8> wrapping (to centre unsigned codes, then read as signed), on
        words16 lanes exact; the same values either way."""
        return self.b.sub(q, self._vc(q, k))

    # --- int8 dot products (llama.cpp's formulation) ------------------------------------------
    def join(self, a, b):
        """Two vectors of equal length end to end (two <16 x i8> -> <32 x i8>)."""
        n = 2 * a.type.count
        return self.b.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, n), list(range(n))))

    def pair_scales(self, sc16, g, signed):
        """<16 x i16> scales for a 32-weight part covering groups g and g + 1 of 16 weights:
        lanes 0..7 = sc16[g], 8..15 = sc16[g + 1] (sc16: <16 x i8>, one lane per group)."""
        v = self.b.shuffle_vector(
            sc16, sc16, ir.Constant(ir.VectorType(I32, 16), [g] * 8 + [g + 1] * 8)
        )
        return self.b.sext(v, V16I16) if signed else self.b.zext(v, V16I16)

    def splat_scale(self, sc):
        """An i32 scale as <16 x i16> (one scale for a whole 32-weight part)."""
        return self.splat(self.b.trunc(sc, I16), V16I16)

    def _evens_odds(self, v):
        n = v.type.count // 2
        ev = self.b.shuffle_vector(
            v, v, ir.Constant(ir.VectorType(I32, n), list(range(0, 2 * n, 2)))
        )
        od = self.b.shuffle_vector(
            v, v, ir.Constant(ir.VectorType(I32, n), list(range(1, 2 * n, 2)))
        )
        return ev, od

    def idot(self, w, y, signed, scales=None, acc=None):
        """Integer dot of 32 weight codes w (<32 x i8>, signed or unsigned) with 32 activation
        codes y (<32 x i8>, -127..127) as <8 x i32> partial sums, llama.cpp's AVX2 order:
        pair sums p_j = w_2j y_2j + w_2j+1 y_2j+1 (16 x i16, no overflow: |p| <= 2 * 128 * 127),
        then lane i = p_2i s_2i + p_2i+1 s_2i+1 with s = scales (<16 x i16>, None: all 1), so a
        part of two 16-weight groups gets its two sub-block scales in lanes 0..7 and 8..15.

        AVX2: pmaddubsw (unsigned x signed bytes: signed codes go in as |w| with y given w's
        sign, as ggml does) then pmaddwd; with VNNI and no scales one vpdpbusd, whose lane i
        is the same sum of bytes 4i..4i+3. Elsewhere the same integers through widening
        multiplies and adds, which LLVM lowers on any target.

        With `avx512`, w and y may also be two such parts end to end (<64 x i8>, scales
        <32 x i16>): the result is then <16 x i32>, lanes 0..7 the first part's, 8..15 the
        second's, from one 512-bit instruction (or pair) instead of two.

        `acc` (the result's type): added to the sums, inside the vpdpbusd where it is one.
        """
        b = self.b
        n = w.type.count
        wide = n == 64
        if self.avx2 and (not wide or self.avx512):
            vty = ir.VectorType(I8, n)
            if signed:
                neg = b.icmp_signed("<", w, ir.Constant(vty, [0] * n))
                w = b.select(neg, b.sub(ir.Constant(vty, [0] * n), w), w)
                y = b.select(neg, b.sub(ir.Constant(vty, [0] * n), y), y)
            accty = ir.VectorType(I32, n // 4)
            if scales is None and (self.vnni512 if wide else self.vnni):
                name = "llvm.x86.avx512.vpdpbusd.512" if wide else "llvm.x86.avx512.vpdpbusd.256"
                dp = cgutils.get_or_insert_function(
                    b.module, ir.FunctionType(accty, [accty, vty, vty]), name
                )
                return b.call(
                    dp, [ir.Constant(accty, [0] * (n // 4)) if acc is None else acc, w, y]
                )
            pty = ir.VectorType(I16, n // 2)
            mub = cgutils.get_or_insert_function(
                b.module,
                ir.FunctionType(pty, [vty, vty]),
                "llvm.x86.avx512.pmaddubs.w.512" if wide else "llvm.x86.avx2.pmadd.ub.sw",
            )
            mwd = cgutils.get_or_insert_function(
                b.module,
                ir.FunctionType(accty, [pty, pty]),
                "llvm.x86.avx512.pmaddw.d.512" if wide else "llvm.x86.avx2.pmadd.wd",
            )
            ones = ir.Constant(pty, [1] * (n // 2))
            v = b.call(mwd, [b.call(mub, [w, y]), ones if scales is None else scales])
            return v if acc is None else b.add(acc, v)
        ity = ir.VectorType(I16, n)
        wi = b.sext(w, ity) if signed else b.zext(w, ity)
        ev, od = self._evens_odds(b.mul(wi, b.sext(y, ity)))
        p = b.sext(b.add(ev, od), ir.VectorType(I32, n // 2))
        if scales is not None:
            p = b.mul(p, b.sext(scales, ir.VectorType(I32, n // 2)))
        ev, od = self._evens_odds(p)
        v = b.add(ev, od)
        return v if acc is None else b.add(acc, v)

    def halves(self, v):
        """The low and high halves of a vector."""
        n = v.type.count // 2
        lo = self.b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n))))
        hi = self.b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n, 2 * n))))
        return lo, hi

    def vec2(self, a, b):
        """Two floats as <2 x float>."""
        v = self.b.insert_element(ir.Constant(V2F, None), a, ir.Constant(I32, 0))
        return self.b.insert_element(v, b, ir.Constant(I32, 1))

    def fmul(self, a, b):
        return _fast(self.b.fmul(a, b))

    def fadd(self, a, b):
        return _fast(self.b.fadd(a, b))

    def fma(self, a, b, c):
        """a * b + c rounded once, always: an accumulation that must round the same whatever
        the code around it (fast-math contraction of fmul + fadd depends on the shape)."""
        ty = a.type
        suffix = f"v{ty.count}f32" if isinstance(ty, ir.VectorType) else "f32"
        fn = cgutils.get_or_insert_function(
            self.b.module, ir.FunctionType(ty, [ty, ty, ty]), f"llvm.fma.{suffix}"
        )
        return self.b.call(fn, [a, b, c])

    def fconst(self, v):
        return ir.Constant(F32, float(v))

    def hsum(self, v):
        n = v.type.count
        while n > 1:
            h = n // 2
            lo = self.b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, h), list(range(h))))
            hi = self.b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, h), list(range(h, n))))
            v = self.fadd(lo, hi)
            n = h
        return self.b.extract_element(v, ir.Constant(I32, 0))


class Group:
    """One group of weights inside a block: w[e0 + i] = d * q[i] + c for i < 16 * len(q).

    q: list of <16 x float> (one or two); d, c: float values or None (meaning 1 and 0).
    """

    __slots__ = ("e0", "q", "d", "c")

    def __init__(self, e0, q, d=None, c=None):
        self.e0, self.q, self.d, self.c = e0, q, d, c


class IntPart:
    """32 consecutive weights of a block as integer codes, for the int8 dot: w[e0 + i] is code
    w[i] (<32 x i8>, `signed` or unsigned) times the part's integer scales (<16 x i16>, lanes
    0..7 for weights 0..15, 8..15 for 16..31; None: 1) times the block's float scale."""

    __slots__ = ("e0", "w", "signed", "scales")

    def __init__(self, e0, w, signed, scales=None):
        self.e0, self.w, self.signed, self.scales = e0, w, signed, scales


class IntBlock:
    """A block as llama.cpp's vec_dot_* sees it: dot(block, x) =
        d * d_x * isum                       isum = sum over parts of scale * (w . x_codes)
      + m * s_x                              (Q8_1 activations: s_x = d_x * sum of x's codes)
      - dmin * d_x * sum_g mins[g] * bsums_x[g]   (Q8_K activations: bsums over 16 weights)
    d, m, dmin: float values; mins: <16 x float> (integers), one lane per group of 16 weights.
    """

    __slots__ = ("d", "parts", "m", "mins", "dmin")

    def __init__(self, d, parts, m=None, mins=None, dmin=None):
        self.d, self.parts, self.m, self.mins, self.dmin = d, parts, m, mins, dmin


class RpPart:
    """Four consecutive weights of R interleaved rows, for the row-interleaved int8 dot: lane
    i of `w` (<4R x i8>: bytes 4i..4i+3) holds row i's codes of weights x_off..x_off+3 of the
    block, signed or unsigned; every lane is dotted with the same four activation codes."""

    __slots__ = ("x_off", "w", "signed")

    def __init__(self, x_off, w, signed):
        self.x_off, self.w, self.signed = x_off, w, signed


def rp_const(R):
    """v -> the constant <R x i32> of v in every lane (the interleaved blocks' scale arithmetic)."""
    vi = ir.VectorType(I32, R)
    return lambda v: ir.Constant(vi, [v] * R)


def rp_nibble_parts(em, field, R, code=None, signed=False, chunk0=0, e0=0):
    """The 8 RpParts of 32 weights stored as Q4_0 stores them (16 bytes, weight e0 + j the low
    nibble of byte j, e0 + 16 + j its high nibble), at 4-byte chunks chunk0 .. chunk0 + 3 of
    `field` (R rows interleaved); code(nibbles) the codes the dot takes (the nibbles; a
    table's values for IQ4 / MXFP4), signed or not."""
    parts = []
    for c in range(4):
        q = em.rp_chunk(field, chunk0 + c, R)
        lo, hi = em.nib_lo(q), em.nib_hi(q)
        if code is not None:
            lo, hi = code(lo), code(hi)
        parts += [RpPart(e0 + 4 * c, lo, signed), RpPart(e0 + 16 + 4 * c, hi, signed)]
    return parts


class RpGroup:
    """Parts sharing one integer scale: scale * (sum over parts of w . x codes - offset *
    the sums of x's codes at `sums`), all in i32 lanes. scale: <R x i32> or None (1); sums:
    indices of the block's code sums (Layout.rp_sum_group codes each) the parts cover, when
    the codes carry an offset (Q4_0 stores q for the weight q - 8: offset 8)."""

    __slots__ = ("parts", "scale", "offset", "sums")

    def __init__(self, parts, scale=None, offset=0, sums=()):
        self.parts, self.scale, self.offset, self.sums = parts, scale, offset, tuple(sums)


class RpBlock:
    """One block of R interleaved rows as the interleaved int8 dot sees it, row i in lane i:
        dot = d_x * d * float(sum of the groups)                 (exact integers)
            + m * s_x                                             (Q8_1 activations)
            - d_x * dmin * float(sum_j mins_j * xsum(sums_j))     (the K-quants' mins)
    d, m, dmin: <R x float> (m, dmin None: no such term); mins: [(<R x i32>, sums)]."""

    __slots__ = ("d", "groups", "m", "mins", "dmin")

    def __init__(self, d, groups, m=None, mins=None, dmin=None):
        self.d, self.groups, self.m, self.mins, self.dmin = d, groups, m, mins, dmin


class Layout:
    """How one GGML type packs a block. Subclasses set the sizes and implement groups() (float
    weights for the float path) and int_block() (integer codes for the int8 path).

    Types with a row-interleaved form also set `rp_fields` and implement rp_block(): the
    packed block of R rows is a permutation of their R blocks' bytes, field by field (see
    repack_rows), and rp_block() reads it back as an RpBlock."""

    block_elems = 32  # weights per block
    block_bytes = 0  # bytes per block
    group = 32  # weights per x-sum group (16 or 32) for groups with an offset c;
    # 0 when no group has one (then no sums are computed)
    # (offset in the block, size, chunk) of each field, in packed order: a plain field (chunk
    # 0) keeps each row's bytes together (R x size: per-row f16 scales); a chunked one
    # interleaves the rows in chunks of 4 bytes (codes: size / 4 vectors of R x 4 bytes, lane i
    # row i's chunk) or of 1 (packed sub-block scales: one vector of R bytes per byte)
    rp_fields: tuple[tuple[int, int, int], ...] = ()
    rp_sum_group = 32  # x codes per sum for RpGroup.sums and RpBlock.mins (16: Q8_K's bsums)

    def groups(self, em: Emit, p) -> list[Group]:
        raise NotImplementedError

    def int_block(self, em: Emit, p) -> IntBlock:
        raise NotImplementedError

    def rp_block(self, em: Emit, field, R: int) -> RpBlock:
        """The packed block of R rows; field(i) is an i8* to rp_fields[i] in it."""
        raise NotImplementedError


def _arr(context, builder, ty, val):
    return context.make_array(ty)(context, builder, val)


def _emit_blocks(builder, nb, super_blocks: bool, emit_block, emit_pair=None) -> None:
    """The loop over a row's nb blocks: one after another for super-blocks (long enough for one
    accumulator chain each), else in pairs on alternating accumulator sets (two independent
    FMA chains; emit_pair(blk) takes blocks blk and blk+1 at once where given), the odd last
    block on set 0."""
    if super_blocks:
        with cgutils.for_range(builder, nb) as loop:
            emit_block(loop.index, 0)
        return
    with cgutils.for_range(builder, builder.udiv(nb, ir.Constant(I64, 2))) as loop:
        blk = builder.mul(loop.index, ir.Constant(I64, 2))
        if emit_pair is not None:
            emit_pair(blk)
        else:
            emit_block(blk, 0)
            emit_block(builder.add(blk, ir.Constant(I64, 1)), 1)
    odd = builder.icmp_unsigned("!=", builder.urem(nb, ir.Constant(I64, 2)), ir.Constant(I64, 0))
    with builder.if_then(odd, likely=False):
        emit_block(builder.sub(nb, ir.Constant(I64, 1)), 0)


PREFETCH_ROWS = 4  # rows ahead whose bytes row_dot asks the cache to fetch


def _prefetch_row(builder, base, rstride, nb, block_bytes):
    """Prefetch (into L2/L1) the packed bytes of the row PREFETCH_ROWS below this one.

    A decode step streams ~100 MB of small weight matrices once each; the hardware
    prefetcher restarts at every matrix and page, so we ask for the data a few rows early.
    Prefetches past the end of the tensor are harmless hints (they never fault).
    """
    fn = builder.module.declare_intrinsic(
        "llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
    )
    ahead = builder.gep(base, [builder.mul(rstride, ir.Constant(I64, PREFETCH_ROWS))])
    nbytes = builder.mul(nb, ir.Constant(I64, block_bytes))
    n_lines = builder.udiv(builder.add(nbytes, ir.Constant(I64, 63)), ir.Constant(I64, 64))
    with cgutils.for_range(builder, n_lines) as loop:
        p = builder.gep(ahead, [builder.mul(loop.index, ir.Constant(I64, 64))])
        builder.call(fn, [p, ir.Constant(I32, 0), ir.Constant(I32, 2), ir.Constant(I32, 1)])


def make_row_dot(layout: Layout, n_tok: int):
    """Intrinsic row_dot(raw, r, x, xs, out, t0): out[t0 + t, r] = raw[r] . x[t0 + t] for t < n_tok.

    raw: 2-D array (rows of packed blocks, any dtype, rows contiguous); x: (T, n_cols) f32 C;
    xs: (T, n_groups) f32 C (group sums of x, unused if the layout has no offsets);
    out: (T, n_rows) f32 C.
    """
    BE, BB, G = layout.block_elems, layout.block_bytes, layout.group

    @intrinsic
    def row_dot(typingctx, raw, r, x, xs, out, t0):
        sig = types.void(raw, r, x, xs, out, t0)

        def codegen(context, builder, signature, args):
            rawv, rv, xv, xsv, outv, t0v = args
            em = make_emit(context, builder)
            ra = _arr(context, builder, signature.args[0], rawv)
            xa = _arr(context, builder, signature.args[2], xv)
            sa = _arr(context, builder, signature.args[3], xsv)
            oa = _arr(context, builder, signature.args[4], outv)
            rstride = cgutils.unpack_tuple(builder, ra.strides)[0]
            xshape = cgutils.unpack_tuple(builder, xa.shape)
            n_cols = xshape[1]
            n_grp = cgutils.unpack_tuple(builder, sa.shape)[1]
            n_rows = cgutils.unpack_tuple(builder, oa.shape)[1]
            base = builder.gep(
                builder.bitcast(ra.data, I8.as_pointer()), [builder.mul(rv, rstride)]
            )
            xp0 = builder.bitcast(xa.data, F32.as_pointer())
            sp0 = builder.bitcast(sa.data, F32.as_pointer())
            op0 = builder.bitcast(oa.data, F32.as_pointer())
            xps, sps = [], []
            for t in range(n_tok):
                tt = builder.add(t0v, ir.Constant(I64, t))
                xps.append(builder.gep(xp0, [builder.mul(tt, n_cols)]))
                sps.append(builder.gep(sp0, [builder.mul(tt, n_grp)]))
            zero = ir.Constant(V16F, [0.0] * 16)
            accs = [
                [cgutils.alloca_once_value(builder, zero) for _ in range(2)] for _ in range(n_tok)
            ]
            saccs = [
                [cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0)) for _ in range(2)]
                for _ in range(n_tok)
            ]

            def emit_block(blk, parity):
                p = builder.gep(base, [builder.mul(blk, ir.Constant(I64, BB))])
                e_base = builder.mul(blk, ir.Constant(I64, BE))
                g_base = builder.udiv(e_base, ir.Constant(I64, G)) if G else None
                for gi, g in enumerate(layout.groups(em, p)):
                    k_acc = (gi & 1) ^ parity
                    for t in range(n_tok):
                        xb = builder.gep(xps[t], [builder.add(e_base, ir.Constant(I64, g.e0))])
                        tsum = None
                        for k, qv in enumerate(g.q):
                            xp = builder.gep(xb, [ir.Constant(I64, 16 * k)])
                            xv16 = builder.load(builder.bitcast(xp, V16F.as_pointer()), align=4)
                            prod = em.fmul(qv, xv16)
                            tsum = prod if tsum is None else em.fadd(tsum, prod)
                        acc = accs[t][k_acc]
                        if g.d is not None:
                            tsum = em.fmul(em.splat(g.d), tsum)
                        builder.store(em.fadd(builder.load(acc), tsum), acc)
                        if g.c is not None:
                            gidx = builder.add(g_base, ir.Constant(I64, g.e0 // G))
                            xsv_ = builder.load(builder.gep(sps[t], [gidx]))
                            sa_ = saccs[t][k_acc]
                            builder.store(em.fadd(builder.load(sa_), em.fmul(g.c, xsv_)), sa_)

            nb = builder.udiv(n_cols, ir.Constant(I64, BE))
            _prefetch_row(builder, base, rstride, nb, BB)
            # super-blocks already alternate the two accumulators between their groups
            _emit_blocks(builder, nb, BE > 32, emit_block)
            for t in range(n_tok):
                v = em.fadd(builder.load(accs[t][0]), builder.load(accs[t][1]))
                sc = em.fadd(builder.load(saccs[t][0]), builder.load(saccs[t][1]))
                res = em.fadd(em.hsum(v), sc)
                tt = builder.add(t0v, ir.Constant(I64, t))
                builder.store(res, builder.gep(op0, [builder.add(builder.mul(tt, n_rows), rv)]))
            return context.get_dummy_value()

        return sig, codegen

    return row_dot


def make_row_dequant(layout: Layout):
    """Intrinsic row_dequant(raw, r, out, o): out[o, :] = weights of packed row r (f32)."""
    BE, BB = layout.block_elems, layout.block_bytes

    @intrinsic
    def row_dequant(typingctx, raw, r, out, o):
        sig = types.void(raw, r, out, o)

        def codegen(context, builder, signature, args):
            rawv, rv, outv, ov = args
            em = make_emit(context, builder)
            ra = _arr(context, builder, signature.args[0], rawv)
            oa = _arr(context, builder, signature.args[2], outv)
            rstride = cgutils.unpack_tuple(builder, ra.strides)[0]
            n_cols = cgutils.unpack_tuple(builder, oa.shape)[1]
            base = builder.gep(
                builder.bitcast(ra.data, I8.as_pointer()), [builder.mul(rv, rstride)]
            )
            op = builder.gep(builder.bitcast(oa.data, F32.as_pointer()), [builder.mul(ov, n_cols)])
            nb = builder.udiv(n_cols, ir.Constant(I64, BE))
            with cgutils.for_range(builder, nb) as loop:
                blk = loop.index
                p = builder.gep(base, [builder.mul(blk, ir.Constant(I64, BB))])
                ob = builder.gep(op, [builder.mul(blk, ir.Constant(I64, BE))])
                for g in layout.groups(em, p):
                    d = em.splat(g.d) if g.d is not None else None
                    c = em.splat(g.c) if g.c is not None else None
                    for k, qv in enumerate(g.q):
                        v = qv
                        if d is not None:
                            v = em.fmul(d, v)
                        if c is not None:
                            v = em.fadd(v, c)
                        dst = builder.bitcast(
                            builder.gep(ob, [ir.Constant(I64, g.e0 + 16 * k)]), V16F.as_pointer()
                        )
                        builder.store(v, dst, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return row_dequant


def make_row_dot_i8(layout: Layout, n_tok: int):
    """Intrinsic row_dot_i8(raw, r, xq, xd, xs, out, t0): out[t0 + t, r] = raw[r] . x[t0 + t]
    for t < n_tok, by llama.cpp's integer formulation (see IntBlock) against x quantised by
    _q8: xq (T, n_cols) int8 codes, xd (T, n_blocks) f32 scales, xs (T, k) f32 extras (Q8_1's
    s per block, Q8_K's bsums per 16); out (T, n_rows) f32. Per block the <8 x i32> integer
    sums are converted once and scaled into <8 x float> accumulators (as ggml's AVX2 code
    does), with one horizontal sum per row.

    With AVX-512 (Emit.avx512) two 32-weight units go through each 512-bit instruction: the
    two blocks of a pair (32-weight types), whose token codes and scales sit side by side in
    xq and xd, or two parts of a super-block. A pair's <16 x float> accumulator holds in its
    halves what the two alternating <8 x float> accumulators hold otherwise, lane for lane
    the same operations, so the result is the same either way, and a token's result is the
    same alone or among others (each unpacked block serves every token of the call). Per
    token that halves the instructions of the dot, the scaling and the accumulation, which is
    what several tokens (slots decoding together) cost beyond the first.
    """
    BE, BB = layout.block_elems, layout.block_bytes

    @intrinsic
    def row_dot_i8(typingctx, raw, r, xq, xd, xs, out, t0):
        sig = types.void(raw, r, xq, xd, xs, out, t0)

        def codegen(context, builder, signature, args):
            rawv, rv, xqv, xdv, xsv, outv, t0v = args
            em = make_emit(context, builder)
            ra = _arr(context, builder, signature.args[0], rawv)
            qa = _arr(context, builder, signature.args[2], xqv)
            da = _arr(context, builder, signature.args[3], xdv)
            sa = _arr(context, builder, signature.args[4], xsv)
            oa = _arr(context, builder, signature.args[5], outv)
            rstride = cgutils.unpack_tuple(builder, ra.strides)[0]
            n_cols = cgutils.unpack_tuple(builder, qa.shape)[1]
            n_xd = cgutils.unpack_tuple(builder, da.shape)[1]
            n_xs = cgutils.unpack_tuple(builder, sa.shape)[1]
            n_rows = cgutils.unpack_tuple(builder, oa.shape)[1]
            base = builder.gep(
                builder.bitcast(ra.data, I8.as_pointer()), [builder.mul(rv, rstride)]
            )
            qp0 = builder.bitcast(qa.data, I8.as_pointer())
            dp0 = builder.bitcast(da.data, F32.as_pointer())
            sp0 = builder.bitcast(sa.data, F32.as_pointer())
            op0 = builder.bitcast(oa.data, F32.as_pointer())
            qps, dps, sps = [], [], []
            for t in range(n_tok):
                tt = builder.add(t0v, ir.Constant(I64, t))
                qps.append(builder.gep(qp0, [builder.mul(tt, n_cols)]))
                dps.append(builder.gep(dp0, [builder.mul(tt, n_xd)]))
                sps.append(builder.gep(sp0, [builder.mul(tt, n_xs)]))
            pairs = em.avx512 and BE == 32  # blocks two by two in 512-bit vectors
            # (n_tok, 2): the accumulators of even and odd blocks; with pairs, one <16 x float>
            # per token whose low and high halves are those two, and a <2 x float> for the extras
            if pairs:
                accs = [
                    cgutils.alloca_once_value(builder, ir.Constant(V16F, [0.0] * 16))
                    for _ in range(n_tok)
                ]
                saccs = [
                    cgutils.alloca_once_value(builder, ir.Constant(V2F, [0.0] * 2))
                    for _ in range(n_tok)
                ]
            else:
                zero = ir.Constant(V8F, [0.0] * 8)
                accs2 = [
                    [cgutils.alloca_once_value(builder, zero) for _ in range(2)]
                    for _ in range(n_tok)
                ]
                saccs2 = [
                    [cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0)) for _ in range(2)]
                    for _ in range(n_tok)
                ]

            def load(ptr, off, ty, align=1):
                return builder.load(
                    builder.bitcast(builder.gep(ptr, [off]), ty.as_pointer()), align=align
                )

            def block_sums(ib, e_base, t):
                """The block's <8 x i32> integer sums for token t (parts two by two with avx512)."""
                isum = wide = None
                parts, i = ib.parts, 0
                while i < len(parts):
                    a = parts[i]
                    b2 = parts[i + 1] if i + 1 < len(parts) else None
                    if (
                        em.avx512
                        and b2 is not None
                        and b2.e0 == a.e0 + 32
                        and b2.signed == a.signed
                        and (a.scales is None) == (b2.scales is None)
                    ):
                        y = load(qps[t], builder.add(e_base, ir.Constant(I64, a.e0)), V64I8)
                        sc = None if a.scales is None else em.join(a.scales, b2.scales)
                        v = em.idot(em.join(a.w, b2.w), y, a.signed, sc)
                        wide = v if wide is None else builder.add(wide, v)
                        i += 2
                        continue
                    y = load(qps[t], builder.add(e_base, ir.Constant(I64, a.e0)), V32I8)
                    v = em.idot(a.w, y, a.signed, a.scales)
                    isum = v if isum is None else builder.add(isum, v)
                    i += 1
                if wide is not None:  # integer sums: any order gives the same
                    lo, hi = em.halves(wide)
                    folded = builder.add(lo, hi)
                    isum = folded if isum is None else builder.add(isum, folded)
                return isum

            def block_extra(ib, blk, dx, t):
                """The factors (a, b) of the block's extra term a * b: m * s_x (Q8_1) or
                -dmin * d_x * sum(mins * bsums) (Q8_K); None when it has none."""
                if ib.m is not None:  # + m * s_x
                    return ib.m, builder.load(builder.gep(sps[t], [blk]))
                if ib.mins is not None:  # - dmin * d_x * sum(mins * bsums): exact integers
                    bp = builder.gep(sps[t], [builder.mul(blk, ir.Constant(I64, BE // 16))])
                    bs = builder.load(builder.bitcast(bp, V16F.as_pointer()), align=4)
                    summs = em.hsum(em.fmul(ib.mins, bs))
                    return em.fmul(em.fmul(ib.dmin, dx), summs), em.fconst(-1.0)
                return None

            def emit_block(blk, parity):
                """One block into the accumulators of its parity (with pairs: the low half)."""
                p = builder.gep(base, [builder.mul(blk, ir.Constant(I64, BB))])
                e_base = builder.mul(blk, ir.Constant(I64, BE))
                ib = layout.int_block(em, p)
                for t in range(n_tok):
                    isum = block_sums(ib, e_base, t)
                    dx = builder.load(builder.gep(dps[t], [blk]))
                    scale = em.splat(em.fmul(ib.d, dx), V8F)
                    extra = block_extra(ib, blk, dx, t)
                    if pairs:  # an odd last block: the low half (parity 0); the high one gets 0 * 0
                        acc = accs[t]
                        pad = ir.Constant(ir.VectorType(I32, 16), list(range(16)))
                        zeros = ir.Constant(V8F, [0.0] * 8)
                        scale16 = builder.shuffle_vector(scale, zeros, pad)
                        sums16 = builder.shuffle_vector(builder.sitofp(isum, V8F), zeros, pad)
                        builder.store(em.fma(scale16, sums16, builder.load(acc)), acc)
                        if extra is not None:
                            sacc, zero = saccs[t], em.fconst(0.0)
                            builder.store(
                                em.fma(
                                    em.vec2(extra[0], zero),
                                    em.vec2(extra[1], zero),
                                    builder.load(sacc),
                                ),
                                sacc,
                            )
                        continue
                    acc = accs2[t][parity]
                    builder.store(em.fma(scale, builder.sitofp(isum, V8F), builder.load(acc)), acc)
                    if extra is not None:
                        sacc = saccs2[t][parity]
                        builder.store(em.fma(extra[0], extra[1], builder.load(sacc)), sacc)

            def emit_pair(blk):
                """Blocks blk and blk + 1 (32 weights each) as one 64-weight unit."""
                p0 = builder.gep(base, [builder.mul(blk, ir.Constant(I64, BB))])
                p1 = builder.gep(p0, [ir.Constant(I64, BB)])
                ib0, ib1 = layout.int_block(em, p0), layout.int_block(em, p1)
                (a,), (b2,) = ib0.parts, ib1.parts
                assert a.scales is None and b2.scales is None and ib0.mins is None
                w = em.join(a.w, b2.w)
                d2 = em.vec2(ib0.d, ib1.d)
                m2 = em.vec2(ib0.m, ib1.m) if ib0.m is not None else None
                e_base = builder.mul(blk, ir.Constant(I64, BE))
                spread = ir.Constant(ir.VectorType(I32, 16), [0] * 8 + [1] * 8)
                for t in range(n_tok):
                    v = em.idot(w, load(qps[t], e_base, V64I8), a.signed)  # <16 x i32>
                    dx2 = load(dps[t], blk, V2F, align=4)
                    sc = em.fmul(d2, dx2)
                    scale = builder.shuffle_vector(sc, sc, spread)
                    builder.store(
                        em.fma(scale, builder.sitofp(v, V16F), builder.load(accs[t])), accs[t]
                    )
                    if m2 is not None:
                        s2 = load(sps[t], blk, V2F, align=4)
                        builder.store(em.fma(m2, s2, builder.load(saccs[t])), saccs[t])

            nb = builder.udiv(n_cols, ir.Constant(I64, BE))
            _prefetch_row(builder, base, rstride, nb, BB)
            _emit_blocks(builder, nb, BE > 32, emit_block, emit_pair if pairs else None)
            for t in range(n_tok):
                if pairs:
                    lo, hi = em.halves(builder.load(accs[t]))
                    v = em.fadd(lo, hi)
                    s2 = builder.load(saccs[t])
                    sc = em.fadd(
                        builder.extract_element(s2, ir.Constant(I32, 0)),
                        builder.extract_element(s2, ir.Constant(I32, 1)),
                    )
                else:
                    v = em.fadd(builder.load(accs2[t][0]), builder.load(accs2[t][1]))
                    sc = em.fadd(builder.load(saccs2[t][0]), builder.load(saccs2[t][1]))
                res = em.fadd(em.hsum(v), sc)
                tt = builder.add(t0v, ir.Constant(I64, t))
                builder.store(res, builder.gep(op0, [builder.add(builder.mul(tt, n_rows), rv)]))
            return context.get_dummy_value()

        return sig, codegen

    return row_dot_i8


# --- row-interleaved int8 dots ----------------------------------------------------------------
#
# make_row_dot_i8 takes one row at a time: per block, its integer sums sit in 8 lanes that are
# scaled lane by lane and summed across at the end of the row, and the block's scales are
# broadcast from scalars. On AVX-512 that costs more shuffle-port work than the dot itself
# (18.6 GMAC/s a thread on Q4_1). ggml's repacked CPU buffers (AMX, and the x86 "Q4_0x8"
# forms) interleave rows instead, which this does: R rows side by side (R = the vector's i32
# lanes), each lane dotting its row's four codes with the same four activation codes broadcast
# (one vpdpbusd for R rows x 4 weights), the per-row scales loaded as vectors. Each block's
# integer sum is exact; it is scaled once per block, as ggml's generic vec_dot does.

PREFETCH_BYTES = 8192  # how far ahead in the packed stream group_dot_i8 asks for the bytes


def rp_lanes(em: Emit) -> int:
    """Rows per interleaved group: the i32 lanes of the widest int8 dot the target has."""
    return 16 if em.avx512 else 8


@intrinsic
def _rp_rows(typingctx):
    def codegen(context, builder, signature, args):
        return ir.Constant(I64, rp_lanes(make_emit(context, builder)))

    return types.int64(), codegen


# The compile target's rows per interleaved group (rp_lanes), as a compile-time int64; callable
# from jitted code only. Typed as what a kernel sees: numba's stubs type an intrinsic's call
# with the typing context argument its decorator supplies.
rp_rows = cast(Callable[[], int], _rp_rows)


def rp_field_offsets(layout: Layout, R: int) -> list[int]:
    """Byte offset of each of layout.rp_fields in a packed block of R rows."""
    offs, at = [], 0
    for _, size, _ in layout.rp_fields:
        offs.append(at)
        at += R * size
    return offs


def make_group_dot_i8(layout: Layout, n_tok: int, planes: int = 1):
    """Intrinsic group_dot_i8(packed, g, xq, xd, xs, xsum, out, t0): for the R rows of group g
    (rows g*R .. g*R+R-1, those below out.shape[1]), out[t0 + t, row] = row . x[t0 + t] for
    t < n_tok, x quantised by _q8 as for make_row_dot_i8 (xq, xd, xs), xsum (T, n_cols /
    layout.rp_sum_group) int32 the sums of x's codes in runs of rp_sum_group (_kern.code_sums;
    for RpGroup offsets and RpBlock mins). packed: (n_groups, n_blocks * R * block_bytes)
    uint8 from repack_rows. The weights' unpacked codes serve every token of the call, and a
    token's result is the same alone or among others.

    planes = 2: each token is two rows of xq, xd, xs, xsum (2t and 2t + 1: _q8.quantize_planes),
    whose dots go into the token's one set of accumulators: x to ~15 bits at twice the integer
    work on the same weight bytes."""
    BB, BE = layout.block_bytes, layout.block_elems
    assert layout.rp_fields

    @intrinsic
    def group_dot_i8(typingctx, packed, g, xq, xd, xs, xsum, out, t0):
        sig = types.void(packed, g, xq, xd, xs, xsum, out, t0)

        def codegen(context, builder, signature, args):
            pv, gv, xqv, xdv, xsv, xuv, outv, t0v = args
            em = make_emit(context, builder)
            R = rp_lanes(em)
            VB, VI, VF = ir.VectorType(I8, 4 * R), ir.VectorType(I32, R), ir.VectorType(F32, R)
            pa = _arr(context, builder, signature.args[0], pv)
            qa = _arr(context, builder, signature.args[2], xqv)
            da = _arr(context, builder, signature.args[3], xdv)
            sa = _arr(context, builder, signature.args[4], xsv)
            ua = _arr(context, builder, signature.args[5], xuv)
            oa = _arr(context, builder, signature.args[6], outv)
            gstride = cgutils.unpack_tuple(builder, pa.strides)[0]
            n_cols = cgutils.unpack_tuple(builder, qa.shape)[1]
            n_xd = cgutils.unpack_tuple(builder, da.shape)[1]
            n_xs = cgutils.unpack_tuple(builder, sa.shape)[1]
            n_xu = cgutils.unpack_tuple(builder, ua.shape)[1]
            n_rows = cgutils.unpack_tuple(builder, oa.shape)[1]
            base = builder.gep(
                builder.bitcast(pa.data, I8.as_pointer()), [builder.mul(gv, gstride)]
            )
            qps, dps, sps, ups = [], [], [], []
            for t in range(n_tok * planes):  # data row of token t // planes, plane t % planes
                tt = builder.add(builder.mul(t0v, ir.Constant(I64, planes)), ir.Constant(I64, t))
                qps.append(
                    builder.gep(
                        builder.bitcast(qa.data, I8.as_pointer()), [builder.mul(tt, n_cols)]
                    )
                )
                dps.append(
                    builder.gep(builder.bitcast(da.data, F32.as_pointer()), [builder.mul(tt, n_xd)])
                )
                sps.append(
                    builder.gep(builder.bitcast(sa.data, F32.as_pointer()), [builder.mul(tt, n_xs)])
                )
                ups.append(
                    builder.gep(builder.bitcast(ua.data, I32.as_pointer()), [builder.mul(tt, n_xu)])
                )
            zf = ir.Constant(VF, [0.0] * R)
            faccs = [cgutils.alloca_once_value(builder, zf) for _ in range(n_tok)]
            maccs = [cgutils.alloca_once_value(builder, zf) for _ in range(n_tok)]
            PB = R * BB
            offs = rp_field_offsets(layout, R)
            pf = builder.module.declare_intrinsic(
                "llvm.prefetch",
                fnty=ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32]),
            )
            zi = ir.Constant(VI, [0] * R)
            x80 = ir.Constant(VB, [-128] * (4 * R))
            has_m = has_mins = False

            def bcast4(t, off):
                """Four activation codes of token t at element off, in every i32 lane."""
                v = builder.load(
                    builder.bitcast(builder.gep(qps[t], [off]), I32.as_pointer()), align=1
                )
                return builder.bitcast(em.splat(v, VI), VB)

            nsum = BE // layout.rp_sum_group  # code sums per block

            def xsum(t, blk, sums):
                """The token's x code sums at `sums` of block blk, added (an i32)."""
                v = None
                for k in sums:
                    idx = builder.add(builder.mul(blk, ir.Constant(I64, nsum)), ir.Constant(I64, k))
                    e = builder.load(builder.gep(ups[t], [idx]))
                    v = e if v is None else builder.add(v, e)
                return v

            with cgutils.for_range(builder, builder.udiv(n_cols, ir.Constant(I64, BE))) as loop:
                blk = loop.index
                p = builder.gep(base, [builder.mul(blk, ir.Constant(I64, PB))])
                for line in range(0, PB, 64):
                    builder.call(
                        pf,
                        [
                            builder.gep(p, [ir.Constant(I64, PREFETCH_BYTES + line)]),
                            ir.Constant(I32, 0),
                            ir.Constant(I32, 2),
                            ir.Constant(I32, 1),
                        ],
                    )
                rb = layout.rp_block(em, lambda i: builder.gep(p, [ir.Constant(I64, offs[i])]), R)
                has_m, has_mins = rb.m is not None, rb.mins is not None
                groups = []  # (parts as (x_off, w), signed, scale, offset, sums)
                for grp in rb.groups:
                    signed = {pt.signed for pt in grp.parts}
                    assert len(signed) == 1, "a group's parts are all signed or all unsigned"
                    parts, offset, sgn = (
                        [(pt.x_off, pt.w) for pt in grp.parts],
                        grp.offset,
                        signed == {True},
                    )
                    if sgn and em.vnni:  # vpdpbusd takes unsigned weights: q + 128
                        assert 4 * len(parts) == layout.rp_sum_group * len(grp.sums), (
                            "offset needs the sums"
                        )
                        parts = [(o, builder.xor(w, x80)) for o, w in parts]
                        offset, sgn = offset + 128, False
                    groups.append((parts, sgn, grp.scale, offset, grp.sums))
                e0 = builder.mul(blk, ir.Constant(I64, BE))
                for t in range(n_tok * planes):  # data row t: plane t % planes of token t // planes
                    total = None
                    for parts, sgn, gscale, offset, sums in groups:
                        chains = [zi, zi]  # two independent dependency chains
                        for k, (o, w) in enumerate(parts):
                            y = bcast4(t, builder.add(e0, ir.Constant(I64, o)))
                            chains[k & 1] = em.idot(w, y, sgn, acc=chains[k & 1])
                        isum = builder.add(*chains)
                        if offset:
                            corr = builder.mul(xsum(t, blk, sums), ir.Constant(I32, offset))
                            isum = builder.sub(isum, em.splat(corr, VI))
                        if gscale is not None:
                            isum = builder.mul(isum, gscale)
                        total = isum if total is None else builder.add(total, isum)
                    fa, ma = faccs[t // planes], maccs[t // planes]
                    dx = builder.load(builder.gep(dps[t], [blk]))
                    dxv = em.splat(dx, VF)
                    builder.store(
                        em.fma(em.fmul(rb.d, dxv), builder.sitofp(total, VF), builder.load(fa)), fa
                    )
                    if has_m:
                        sx = builder.load(builder.gep(sps[t], [blk]))
                        builder.store(em.fma(rb.m, em.splat(sx, VF), builder.load(ma)), ma)
                    if has_mins:
                        msum = None
                        for mj, sums in rb.mins:
                            v = builder.mul(mj, em.splat(xsum(t, blk, sums), VI))
                            msum = v if msum is None else builder.add(msum, v)
                        builder.store(
                            em.fma(
                                em.fmul(rb.dmin, dxv), builder.sitofp(msum, VF), builder.load(ma)
                            ),
                            ma,
                        )
            # the rows of this group that exist: a masked store (the last group may be partial)
            r0 = builder.mul(gv, ir.Constant(I64, R))
            left = builder.trunc(builder.sub(n_rows, r0), I32)
            lanes = ir.Constant(VI, list(range(R)))
            mask = builder.icmp_signed("<", lanes, em.splat(left, VI))
            mstore = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ir.VoidType(), [VF, VF.as_pointer(), I32, mask.type]),
                f"llvm.masked.store.v{R}f32.p0v{R}f32",
            )
            op0 = builder.bitcast(oa.data, F32.as_pointer())
            for t in range(n_tok):
                res = builder.load(faccs[t])
                if has_m:
                    res = em.fadd(res, builder.load(maccs[t]))
                elif has_mins:
                    res = _fast(builder.fsub(res, builder.load(maccs[t])))
                tt = builder.add(t0v, ir.Constant(I64, t))
                dst = builder.gep(op0, [builder.add(builder.mul(tt, n_rows), r0)])
                builder.call(
                    mstore, [res, builder.bitcast(dst, VF.as_pointer()), ir.Constant(I32, 4), mask]
                )
            return context.get_dummy_value()

        return sig, codegen

    return group_dot_i8
