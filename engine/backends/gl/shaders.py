"""GLSL 430 compute shaders: quantised mat-mul, RMSNorm, RoPE, KV store, attention, gated
activations, residual add.

Conventions shared by every shader: binding 0 is the context's compute scratch (`float s[]`;
activations, and int data such as positions stored as float bits); weights and KV caches are
`uint` arrays at bindings 1 and 2. Integer parameters come in `uniform int P[16]`, float ones
in `uniform float F[4]`, offsets counted in floats of the scratch.

Weights are the GGUF's packed blocks, unchanged. Blocks of 18, 22 or 34 bytes start at
2-byte-aligned offsets, so every multi-byte field is read through rd16/rd32, which take a
byte offset and combine the (at most two) uint words that hold it. The mat-mul asks each type
for one 32-weight sub-block at a time (`dot32`), so K-quants (256-weight super-blocks)
and the legacy 32-weight blocks share one loop.
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

HEADER = """#version 430
layout(local_size_x = LOCAL) in;
uniform int P[16];
uniform float F[4];
layout(std430, binding = 0) buffer Scratch { float s[]; };
int si(int i) { return floatBitsToInt(s[i]); }
// the flat invocation index of a 1-D shader dispatched over (x, y) workgroups (device.groups_1d)
int gid() {
    return int((gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x
               + gl_LocalInvocationID.x);
}
"""

READERS = """
layout(std430, binding = 1) readonly buffer Weights { uint W[]; };
uint rd8(uint o) { return (W[o >> 2] >> ((o & 3u) * 8u)) & 255u; }
#ifdef ALIGNED  // every block starts on a uint: one load
uint rd32(uint o) { return W[o >> 2]; }
#else
uint rd32(uint o) {  // o even
    uint w0 = W[o >> 2];
    return (o & 2u) == 0u ? w0 : (w0 >> 16) | (W[(o >> 2) + 1u] << 16);
}
#endif
float rdh(uint o) { return unpackHalf2x16(W[o >> 2] >> ((o & 2u) * 8u)).x; }  // f16 at even o
int i8(uint b) { return int(b << 24) >> 24; }
// the uint at even byte o from the words lo = W[o >> 2] and hi = W[(o >> 2) + 1]: a run of
// uints at o, o + 4, ... then costs one load each (weight buffers end with a spare uint)
uint join(uint lo, uint hi, uint o) { return (o & 2u) == 0u ? lo : (lo >> 16) | (hi << 16); }
// Q4_K's 6-bit scale and min of sub-block j from the 12 bytes at b + 4 (ggml's get_scale_min_k4)
void scale_min_k4(uint b, uint j, out uint sc, out uint m) {
    if (j < 4u) {
        sc = rd8(b + 4u + j) & 63u;
        m = rd8(b + 8u + j) & 63u;
    } else {
        sc = (rd8(b + 8u + j) & 15u) | ((rd8(b + j) >> 6) << 4);
        m = (rd8(b + 8u + j) >> 4) | ((rd8(b + 4u + j) >> 6) << 4);
    }
}
"""

# Each: float dot32(uint rowb, uint sb, int xo) -- the dot product of weights sb*32 ..
# sb*32+31 of the row starting at byte rowb with the 32 floats of the scratch at xo. (Scalar
# code over vec4s, no local arrays: llvmpipe spills dynamically indexed arrays to memory.)
VEC = """
layout(std430, binding = 0) readonly buffer Scratch4 { vec4 s4[]; };  // the scratch again, 16 B at a time
vec4 x4(int o) { return s4[o >> 2]; }  // o is a multiple of 4 (matmul_gl checks)
vec4 nlo(uint q) { return vec4((uvec4(q) >> uvec4(0u, 8u, 16u, 24u)) & 15u); }
vec4 nhi(uint q) { return vec4((uvec4(q) >> uvec4(4u, 12u, 20u, 28u)) & 15u); }
vec4 bits4(uint h, uint i) { return vec4((uvec4(h) >> uvec4(i, i + 1u, i + 2u, i + 3u)) & 1u); }
vec4 sbytes(uint q) { return vec4(ivec4(q << 24, q << 16, q << 8, q) >> 24); }
"""

DOT = {
    # Q4_0 (18 B): d f16 | qs[16]: weight i<16 is the low nibble of qs[i], i>=16 the high one;
    # w = (q - 8) * d
    Q.Q4_0: """
float dot32(uint rowb, uint sb, int xo) {
    uint b = rowb + sb * 18u, o = b + 2u, i = o >> 2, lo = W[i];
    vec4 a = vec4(0.0);
    for (uint k = 0u; k < 4u; k++) {
        uint hi = W[i + k + 1u], q = join(lo, hi, o);
        a += (nlo(q) - 8.0) * x4(xo + 4 * int(k)) + (nhi(q) - 8.0) * x4(xo + 16 + 4 * int(k));
        lo = hi;
    }
    return rdh(b) * (a.x + a.y + a.z + a.w);
}""",
    # Q4_1 (20 B): d f16 | m f16 | qs[16] as Q4_0; w = q * d + m
    Q.Q4_1: """
float dot32(uint rowb, uint sb, int xo) {
    uint b = rowb + sb * 20u;
    vec4 a = vec4(0.0), sx = vec4(0.0);
    for (uint k = 0u; k < 4u; k++) {
        uint q = rd32(b + 4u + 4u * k);
        vec4 x0 = x4(xo + 4 * int(k)), x1 = x4(xo + 16 + 4 * int(k));
        a += nlo(q) * x0 + nhi(q) * x1;
        sx += x0 + x1;
    }
    return rdh(b) * (a.x + a.y + a.z + a.w) + rdh(b + 2u) * (sx.x + sx.y + sx.z + sx.w);
}""",
    # Q5_0 (22 B): d f16 | qh u32 (bit i: 5th bit of weight i) | qs[16] as Q4_0; w = (q - 16) * d
    Q.Q5_0: """
float dot32(uint rowb, uint sb, int xo) {
    uint b = rowb + sb * 22u, o = b + 2u, i = o >> 2, lo = W[i + 1u];
    uint qh = join(W[i], lo, o);
    vec4 a = vec4(0.0);
    for (uint k = 0u; k < 4u; k++) {
        uint hi = W[i + k + 2u], q = join(lo, hi, o);
        a += (nlo(q) + 16.0 * bits4(qh, 4u * k) - 16.0) * x4(xo + 4 * int(k))
           + (nhi(q) + 16.0 * bits4(qh, 16u + 4u * k) - 16.0) * x4(xo + 16 + 4 * int(k));
        lo = hi;
    }
    return rdh(b) * (a.x + a.y + a.z + a.w);
}""",
    # Q8_0 (34 B): d f16 | qs int8[32]; w = q * d
    Q.Q8_0: """
float dot32(uint rowb, uint sb, int xo) {
    uint b = rowb + sb * 34u, o = b + 2u, i = o >> 2, lo = W[i];
    vec4 a = vec4(0.0);
    for (uint k = 0u; k < 8u; k++) {
        uint hi = W[i + k + 1u];
        a += sbytes(join(lo, hi, o)) * x4(xo + 4 * int(k));
        lo = hi;
    }
    return rdh(b) * (a.x + a.y + a.z + a.w);
}""",
    # Q4_K (144 B per 256): d f16 | dmin f16 | scales[12] (8 x 6-bit scale, 6-bit min) | qs[128].
    # Sub-block j: 64-weight chunk j/2 of qs, low nibbles for even j, high for odd;
    # w = d * sc_j * q - dmin * m_j.
    Q.Q4_K: """
float dot32(uint rowb, uint sb, int xo) {
    uint b = rowb + (sb >> 3) * 144u, j = sb & 7u;
    uint sc, m;
    scale_min_k4(b, j, sc, m);
    uint q0 = b + 16u + 32u * (j >> 1);
    vec4 a = vec4(0.0), sx = vec4(0.0);
    for (uint k = 0u; k < 8u; k++) {
        uint q = rd32(q0 + 4u * k);
        vec4 x = x4(xo + 4 * int(k));
        a += ((j & 1u) == 0u ? nlo(q) : nhi(q)) * x;
        sx += x;
    }
    return rdh(b) * float(sc) * (a.x + a.y + a.z + a.w) - rdh(b + 2u) * float(m) * (sx.x + sx.y + sx.z + sx.w);
}""",
    # Q6_K (210 B per 256): ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales int8[16] | d f16.
    # Half n (128 weights) = 4 sub-blocks k of 32: ql[64n + 32(k&1) + l] nibble k>>1,
    # qh[32n + l] bits 2k..2k+1, scale[8n + 2k + l/16]; w = d * scale * (q - 32).
    Q.Q6_K: """
float dot32(uint rowb, uint sb, int xo) {
    uint b = rowb + (sb >> 3) * 210u, j = sb & 7u, n = j >> 2, k = j & 3u;
    uint l0 = b + 64u * n + 32u * (k & 1u), h0 = b + 128u + 32u * n, ls = (k >> 1) * 4u, hs = 2u * k;
    uvec4 lsh = uvec4(0u, 8u, 16u, 24u) + ls, hsh = uvec4(0u, 8u, 16u, 24u) + hs;
    vec4 a0 = vec4(0.0), a1 = vec4(0.0);
    for (uint w = 0u; w < 8u; w++) {
        uvec4 q = ((uvec4(rd32(l0 + 4u * w)) >> lsh) & 15u) | (((uvec4(rd32(h0 + 4u * w)) >> hsh) & 3u) << 4);
        vec4 p = (vec4(q) - 32.0) * x4(xo + 4 * int(w));
        if (w < 4u) a0 += p; else a1 += p;
    }
    float s0 = float(i8(rd8(b + 192u + 8u * n + 2u * k))), s1 = float(i8(rd8(b + 193u + 8u * n + 2u * k)));
    return rdh(b + 208u) * (s0 * (a0.x + a0.y + a0.z + a0.w) + s1 * (a1.x + a1.y + a1.z + a1.w));
}""",
    Q.F16: """
float dot32(uint rowb, uint sb, int xo) {
    uint b = rowb + sb * 64u;
    vec4 a = vec4(0.0);
    for (uint k = 0u; k < 8u; k++)
        a += vec4(unpackHalf2x16(rd32(b + 8u * k)), unpackHalf2x16(rd32(b + 8u * k + 4u))) * x4(xo + 4 * int(k));
    return a.x + a.y + a.z + a.w;
}""",
    Q.F32: """
float dot32(uint rowb, uint sb, int xo) {
    uint b = rowb + sb * 128u;
    vec4 a = vec4(0.0);
    for (uint k = 0u; k < 8u; k++) {
        uint o = b + 16u * k;
        a += uintBitsToFloat(uvec4(rd32(o), rd32(o + 4u), rd32(o + 8u), rd32(o + 12u))) * x4(xo + 4 * int(k));
    }
    return a.x + a.y + a.z + a.w;
}""",
}


# Each: void blk(uint rowb, uint sb, out vec4 w[8]) -- weights sb*32 .. sb*32+31 of the row
# at byte rowb, dequantised (the same layouts as DOT): the mat-mul of 4 tokens decodes a
# sub-block once for all four.
BLK = {
    Q.Q4_0: """
void blk(uint rowb, uint sb, out vec4 w[8]) {
    uint b = rowb + sb * 18u, o = b + 2u, i = o >> 2, lo = W[i];
    float d = rdh(b);
    for (uint k = 0u; k < 4u; k++) {
        uint hi = W[i + k + 1u], q = join(lo, hi, o);
        w[k] = (nlo(q) - 8.0) * d;
        w[4u + k] = (nhi(q) - 8.0) * d;
        lo = hi;
    }
}""",
    Q.Q4_1: """
void blk(uint rowb, uint sb, out vec4 w[8]) {
    uint b = rowb + sb * 20u;
    float d = rdh(b), m = rdh(b + 2u);
    for (uint k = 0u; k < 4u; k++) {
        uint q = rd32(b + 4u + 4u * k);
        w[k] = nlo(q) * d + m;
        w[4u + k] = nhi(q) * d + m;
    }
}""",
    Q.Q5_0: """
void blk(uint rowb, uint sb, out vec4 w[8]) {
    uint b = rowb + sb * 22u, o = b + 2u, i = o >> 2, lo = W[i + 1u];
    uint qh = join(W[i], lo, o);
    float d = rdh(b);
    for (uint k = 0u; k < 4u; k++) {
        uint hi = W[i + k + 2u], q = join(lo, hi, o);
        w[k] = (nlo(q) + 16.0 * bits4(qh, 4u * k) - 16.0) * d;
        w[4u + k] = (nhi(q) + 16.0 * bits4(qh, 16u + 4u * k) - 16.0) * d;
        lo = hi;
    }
}""",
    Q.Q8_0: """
void blk(uint rowb, uint sb, out vec4 w[8]) {
    uint b = rowb + sb * 34u, o = b + 2u, i = o >> 2, lo = W[i];
    float d = rdh(b);
    for (uint k = 0u; k < 8u; k++) {
        uint hi = W[i + k + 1u];
        w[k] = sbytes(join(lo, hi, o)) * d;
        lo = hi;
    }
}""",
    Q.Q4_K: """
void blk(uint rowb, uint sb, out vec4 w[8]) {
    uint b = rowb + (sb >> 3) * 144u, j = sb & 7u;
    uint sc, m;
    scale_min_k4(b, j, sc, m);
    float dl = rdh(b) * float(sc), ml = rdh(b + 2u) * float(m);
    uint q0 = b + 16u + 32u * (j >> 1);
    for (uint k = 0u; k < 8u; k++) {
        uint q = rd32(q0 + 4u * k);
        w[k] = ((j & 1u) == 0u ? nlo(q) : nhi(q)) * dl - ml;
    }
}""",
    Q.Q6_K: """
void blk(uint rowb, uint sb, out vec4 w[8]) {
    uint b = rowb + (sb >> 3) * 210u, j = sb & 7u, n = j >> 2, k = j & 3u;
    uint l0 = b + 64u * n + 32u * (k & 1u), h0 = b + 128u + 32u * n, ls = (k >> 1) * 4u, hs = 2u * k;
    uvec4 lsh = uvec4(0u, 8u, 16u, 24u) + ls, hsh = uvec4(0u, 8u, 16u, 24u) + hs;
    float d = rdh(b + 208u);
    float s0 = d * float(i8(rd8(b + 192u + 8u * n + 2u * k))), s1 = d * float(i8(rd8(b + 193u + 8u * n + 2u * k)));
    for (uint i = 0u; i < 8u; i++) {
        uvec4 q = ((uvec4(rd32(l0 + 4u * i)) >> lsh) & 15u) | (((uvec4(rd32(h0 + 4u * i)) >> hsh) & 3u) << 4);
        w[i] = (vec4(q) - 32.0) * (i < 4u ? s0 : s1);
    }
}""",
    Q.F16: """
void blk(uint rowb, uint sb, out vec4 w[8]) {
    uint b = rowb + sb * 64u;
    for (uint k = 0u; k < 8u; k++)
        w[k] = vec4(unpackHalf2x16(rd32(b + 8u * k)), unpackHalf2x16(rd32(b + 8u * k + 4u)));
}""",
    Q.F32: """
void blk(uint rowb, uint sb, out vec4 w[8]) {
    uint b = rowb + sb * 128u;
    for (uint k = 0u; k < 8u; k++) {
        uint o = b + 16u * k;
        w[k] = uintBitsToFloat(uvec4(rd32(o), rd32(o + 4u), rd32(o + 8u), rd32(o + 12u)));
    }
}""",
}

MATMUL_TOKENS = 8  # tokens one invocation serves (its weight row stays in cache between them)

# out[t, r] (+)= sum_c W[r, c] x[t, c]. One invocation per (row, group of MATMUL_TOKENS tokens).
# P: 0 n_rows, 1 n_cols, 2 row bytes, 3 T, 4 x offset, 5 x row stride, 6 out offset,
#    7 out row stride, 8 accumulate (1: add into out, the residual stream)
MATMUL = """
void main() {
    uint r = gl_GlobalInvocationID.x;
    if (r >= uint(P[0])) return;
    int t0 = int(gl_WorkGroupID.y) * TT, t1 = min(P[3], t0 + TT);
    uint nsub = uint(P[1]) / 32u, rowb = r * uint(P[2]);
    for (int t = t0; t < t1; t++) {
        int xo = P[4] + t * P[5];
        float acc = 0.0;
        for (uint sb = 0u; sb < nsub; sb++) acc += dot32(rowb, sb, xo + 32 * int(sb));
        int o = P[6] + t * P[7] + int(r);
        s[o] = (P[8] != 0 ? s[o] : 0.0) + acc;
    }
}
""".replace("TT", str(MATMUL_TOKENS))

COOP_WG = 64
# For GPUs (not software rasterisers): one workgroup per (row, token), its threads taking
# every COOP_WG-th sub-block of the row, so that neighbouring threads read neighbouring blocks,
# then a tree sum in shared memory. Rows spread over grid x and z (65535 x per dispatch).
MATMUL_COOP = """
shared float red[LOCAL];
void main() {
    uint r = gl_WorkGroupID.z * 65535u + gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    int t = int(gl_WorkGroupID.y);
    if (r >= uint(P[0])) return;
    uint nsub = uint(P[1]) / 32u, rowb = r * uint(P[2]);
    int xo = P[4] + t * P[5];
    float acc = 0.0;
    for (uint sb = tid; sb < nsub; sb += uint(LOCAL)) acc += dot32(rowb, sb, xo + 32 * int(sb));
    red[tid] = acc;
    barrier();
    for (uint k = uint(LOCAL) / 2u; k > 0u; k >>= 1) {
        if (tid < k) red[tid] += red[tid + k];
        barrier();
    }
    if (tid == 0u) {
        int o = P[6] + t * P[7] + int(r);
        s[o] = (P[8] != 0 ? s[o] : 0.0) + red[0];
    }
}
"""

MATMUL4_MIN_TOKENS = 4  # from this many tokens on, matmul4 (weights decoded once per 4 tokens)
# As MATMUL, four tokens per invocation (grid y = ceil(T / 4)); a missing 4th token reads the
# group's first row again and is not written.
MATMUL4 = """
void main() {
    uint r = gl_GlobalInvocationID.x;
    if (r >= uint(P[0])) return;
    int t0 = int(gl_WorkGroupID.y) * 4, n = min(4, P[3] - t0);
    uint nsub = uint(P[1]) / 32u, rowb = r * uint(P[2]);
    int x0 = P[4] + t0 * P[5];
    int s1 = n > 1 ? P[5] : 0, s2 = n > 2 ? 2 * P[5] : 0, s3 = n > 3 ? 3 * P[5] : 0;
    vec4 acc = vec4(0.0);
    vec4 w[8];
    for (uint sb = 0u; sb < nsub; sb++) {
        blk(rowb, sb, w);
        int xo = x0 + 32 * int(sb);
        for (int k = 0; k < 8; k++) {
            int o = xo + 4 * k;
            acc += vec4(dot(w[k], x4(o)), dot(w[k], x4(o + s1)), dot(w[k], x4(o + s2)), dot(w[k], x4(o + s3)));
        }
    }
    int o = P[6] + t0 * P[7] + int(r);
    s[o] = (P[8] != 0 ? s[o] : 0.0) + acc.x;
    if (n > 1) s[o + P[7]] = (P[8] != 0 ? s[o + P[7]] : 0.0) + acc.y;
    if (n > 2) s[o + 2 * P[7]] = (P[8] != 0 ? s[o + 2 * P[7]] : 0.0) + acc.z;
    if (n > 3) s[o + 3 * P[7]] = (P[8] != 0 ? s[o + 3 * P[7]] : 0.0) + acc.w;
}
"""


# out row = x row / rms(x row) * w, one invocation per row; mode 1 adds into out instead.
# P: 0 rows, 1 n, 2 x offset, 3 x row stride, 4 out offset, 5 out row stride, 6 mode,
#    7 gather (>= 0: offset of int row indices into x), F0 eps
RMSNORM = """
layout(std430, binding = 1) readonly buffer Norm { float nw[]; };
void main() {
    int r = gid();
    if (r >= P[0]) return;
    int n = P[1], xr = P[7] >= 0 ? si(P[7] + r) : r;
    int x = P[2] + xr * P[3], o = P[4] + r * P[5];
    float ss = 0.0;
    for (int i = 0; i < n; i++) ss += s[x + i] * s[x + i];
    float k = 1.0 / sqrt(ss / float(n) + F[0]);
    for (int i = 0; i < n; i++) {
        float y = s[x + i] * k * nw[i];
        s[o + i] = P[6] == 1 ? s[o + i] + y : y;
    }
}
"""

# Rotate pair i of head h of token t in place by the precomputed cos/sin (T, half) tables.
# P: 0 x offset, 1 T, 2 heads, 3 head_dim, 4 half (rotated pairs), 5 neox, 6 cos offset,
#    7 sin offset
ROPE = """
void main() {
    int idx = gid(), half_ = P[4], H = P[2];
    if (idx >= P[1] * H * half_) return;
    int i = idx % half_, h = (idx / half_) % H, t = idx / (half_ * H);
    int base = P[0] + (t * H + h) * P[3];
    int i0 = P[5] != 0 ? i : 2 * i, i1 = P[5] != 0 ? i + half_ : 2 * i + 1;
    float c = s[P[6] + t * half_ + i], sn = s[P[7] + t * half_ + i];
    float a = s[base + i0], b = s[base + i1];
    s[base + i0] = a * c - b * sn;
    s[base + i1] = a * sn + b * c;
}
"""

# k (T, kw) and v (T, vw) into the caches at (stream[t], cell[t]); two values per invocation.
# P: 0 k offset, 1 v offset, 2 T, 3 kw, 4 vw, 5 stream offset (ints), 6 cell offset (ints),
#    7 n_cells, 8 k is f16, 9 v is f16
KV_STORE = """
layout(std430, binding = 1) buffer KC { uint kc[]; };
layout(std430, binding = 2) buffer VC { uint vc[]; };
void put(bool f16, int src, int w, int t, int j, int row, bool isk) {
    float a = s[src + t * w + 2 * j], b = s[src + t * w + 2 * j + 1];
    int e = row * w + 2 * j;
    if (f16) {
        if (isk) kc[e >> 1] = packHalf2x16(vec2(a, b)); else vc[e >> 1] = packHalf2x16(vec2(a, b));
    } else if (isk) {
        kc[e] = floatBitsToUint(a); kc[e + 1] = floatBitsToUint(b);
    } else {
        vc[e] = floatBitsToUint(a); vc[e + 1] = floatBitsToUint(b);
    }
}
void main() {
    int idx = gid(), kh = P[3] / 2, vh = P[4] / 2;
    if (idx >= P[2] * (kh + vh)) return;
    int t = idx / (kh + vh), j = idx % (kh + vh);
    int row = si(P[5] + t) * P[7] + si(P[6] + t);
    if (j < kh) put(P[8] != 0, P[0], P[3], t, j, row, true);
    else put(P[9] != 0, P[1], P[4], t, j - kh, row, false);
}
"""

ATTN_WG = 64
ATTN_MAX_DIM = 512
# One workgroup per (head, token): the token's own sequence, causal, within the window, scores
# q.k * scale (soft-capped when F1 > 0), an online softmax over chunks of ATTN_WG positions.
# Thread i scores position chunk + i; then each thread owns output dims i, i + ATTN_WG, ...
# P: 0 q offset, 1 out offset, 2 n_head, 3 n_head_kv, 4 head_dim, 5 head_dim_v, 6 pos offset,
#    7 stream offset, 8 base offset (cell of position 0), 9 n_cells, 10 window, 11 k f16,
#    12 v f16; F0 scale, F1 softcap
ATTENTION = """
layout(std430, binding = 1) readonly buffer KC { uint kc[]; };
layout(std430, binding = 2) readonly buffer VC { uint vc[]; };
shared float qs[MAXD];
shared float pr[LOCAL];
float kval(bool f16, int e) { return f16 ? unpackHalf2x16(kc[e >> 1])[e & 1] : uintBitsToFloat(kc[e]); }
float vval(bool f16, int e) { return f16 ? unpackHalf2x16(vc[e >> 1])[e & 1] : uintBitsToFloat(vc[e]); }
void main() {
    int h = int(gl_WorkGroupID.x), t = int(gl_WorkGroupID.y), tid = int(gl_LocalInvocationID.x);
    int H = P[2], G = P[3], D = P[4], Dv = P[5];
    int g = h / (H / G);
    int qo = P[0] + (t * H + h) * D;
    for (int i = tid; i < D; i += LOCAL) qs[i] = s[qo + i];
    barrier();
    int pos = si(P[6] + t), row0 = si(P[7] + t) * P[9] + si(P[8] + t);
    int lo = P[10] > 0 ? max(0, pos - P[10] + 1) : 0;
    bool kf = P[11] != 0, vf = P[12] != 0;
    float m = -1.0 / 0.0, l = 0.0;
    float acc[NACC];
    for (int a = 0; a < NACC; a++) acc[a] = 0.0;
    for (int c0 = lo; c0 <= pos; c0 += LOCAL) {
        int p = c0 + tid;
        float sc = -1.0 / 0.0;
        if (p <= pos) {
            int kb = ((row0 + p) * G + g) * D;
            float d = 0.0;
            for (int i = 0; i < D; i++) d += qs[i] * kval(kf, kb + i);
            sc = d * F[0];
            if (F[1] > 0.0) sc = F[1] * tanh(sc / F[1]);
        }
        pr[tid] = sc;
        barrier();
        float cm = m;
        for (int i = 0; i < LOCAL; i++) cm = max(cm, pr[i]);
        barrier();
        pr[tid] = exp(sc - cm);
        barrier();
        float f = exp(m - cm), sum = 0.0;
        int n = min(LOCAL, pos - c0 + 1);
        for (int i = 0; i < n; i++) sum += pr[i];
        l = l * f + sum;
        for (int a = 0; a * LOCAL + tid < Dv; a++) {
            int dd = a * LOCAL + tid;
            float y = acc[a] * f;
            for (int i = 0; i < n; i++) y += pr[i] * vval(vf, ((row0 + c0 + i) * G + g) * Dv + dd);
            acc[a] = y;
        }
        m = cm;
        barrier();
    }
    int oo = P[1] + (t * H + h) * Dv;
    for (int a = 0; a * LOCAL + tid < Dv; a++) s[oo + a * LOCAL + tid] = acc[a] / l;
}
""".replace("MAXD", str(ATTN_MAX_DIM)).replace("NACC", str(ATTN_MAX_DIM // ATTN_WG))

# gate = act(gate) * up elementwise; P: 0 gate offset, 1 up offset, 2 n, 3 kind (0 silu,
# 1 tanh-GELU as ggml_gelu); rows may be strided: 4 width, 5 gate stride, 6 up stride
GATED_ACT = """
void main() {
    int idx = gid();
    if (idx >= P[2]) return;
    int t = idx / P[4], i = idx % P[4];
    int go = P[0] + t * P[5] + i;
    float v = s[go], u = s[P[1] + t * P[6] + i];
    float z = P[3] == 0 ? v : 0.7978845608028654 * (v + 0.044715 * v * v * v) * 2.0;
    s[go] = v / (1.0 + exp(-z)) * u;
}
"""

# x[i] += y[i]; P: 0 x offset, 1 y offset, 2 n
ADD = """
void main() {
    int i = gid();
    if (i < P[2]) s[P[0] + i] += s[P[1] + i];
}
"""

# x[t, i] += b[i] (biases); P: 0 x offset, 1 n (T * width), 2 width
ADD_ROWS = """
layout(std430, binding = 1) readonly buffer Bias { float b[]; };
void main() {
    int i = gid();
    if (i < P[1]) s[P[0] + i] += b[i % P[2]];
}
"""

# x[i] *= F0; P: 0 x offset, 1 n
SCALE = """
void main() {
    int i = gid();
    if (i < P[1]) s[P[0] + i] *= F[0];
}
"""

OPS = {
    "rmsnorm": RMSNORM,
    "rope": ROPE,
    "kv_store": KV_STORE,
    "attention": ATTENTION,
    "gated_act": GATED_ACT,
    "add": ADD,
    "add_rows": ADD_ROWS,
    "scale": SCALE,
}
LOCAL_SIZE = {"attention": ATTN_WG}
COOP_PREFIX = "matmulcoop_"
DEFAULT_LOCAL = 64


def source(name: str) -> str:
    """The full GLSL source of shader `name`: "matmul_<qtype>", "matmul4_<qtype>",
    "matmulcoop_<qtype>" (each with "_a" for rows whose blocks all start on a uint) or an op
    name."""
    local = COOP_WG if name.startswith(COOP_PREFIX) else LOCAL_SIZE.get(name, DEFAULT_LOCAL)
    head = HEADER.replace("LOCAL) in", f"{local}) in").replace("LOCAL", str(local))
    if name.startswith("matmul"):  # matmul[4]_<qtype>[_a]: _a when every block is uint-aligned
        kind, qname = name.split("_", 1)
        aligned = qname.endswith("_a")
        qtype = Q[qname.removesuffix("_a").upper()]
        body = {
            "matmul4": BLK[qtype] + MATMUL4,
            "matmulcoop": DOT[qtype] + MATMUL_COOP,
            "matmul": DOT[qtype] + MATMUL,
        }[kind]
        return (
            head
            + ("#define ALIGNED\n" if aligned else "")
            + READERS
            + VEC
            + body.replace("LOCAL", str(local))
        )
    body = OPS[name]
    return head + body.replace("LOCAL", str(local))


MATMUL_TYPES = frozenset(DOT)


def matmul_names(qtype: Q) -> list[str]:
    """The mat-mul shaders of qtype: the general ones, and the aligned ones where they exist."""
    q = qtype.name.lower()
    names = [f"matmul_{q}", f"matmul4_{q}", f"matmulcoop_{q}"]
    if GGML_QUANT_SIZES[qtype][1] % 4 == 0:
        names += [f"matmul_{q}_a", f"matmul4_{q}_a", f"matmulcoop_{q}_a"]
    return names
