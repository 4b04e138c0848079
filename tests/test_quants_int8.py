"""The int8 decode path (llama.cpp's formulation) against numpy transcriptions of ggml.

The activation quantisers (engine/quants/_q8.py) against quantize_row_q8_0/q8_1 (x86, AVX) and
quantize_row_q8_K_ref bit for bit; the integer mat-vec of every block type against ggml's
vec_dot_* (x's codes times the weights, scales per block) to float rounding; the int8 path
against the float path within the quantisation error of x; the instruction selection and the
GGSTATION_NO_INT8 switch.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import numba
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize as gguf_quantize

from engine import quants
from engine.quants import _ir, _q8, codegen
from engine.quants.reference import dequant_ref
from tests.test_quants import (
    ALL,
    DENSE,
    OTHER_TARGETS,
    _cols,
    lowered_ops,
    make_tensor,
    module_for,
    nerr,
)

BLOCK_TYPES = [t for t in ALL if t not in DENSE]
VEC_DOT = {T[s.name]: s.vec_dot for s in codegen.TYPES if s.vec_dot}
F32 = np.float32


# --- numpy transcriptions of ggml ---------------------------------------------------------------
def ref_q8_blocks(x: np.ndarray):
    """quantize_row_q8_0 / q8_1 (ggml-cpu/arch/x86/quants.c, AVX): codes, f16 d, f16 s."""
    xb = x.reshape(x.shape[0], -1, 32).astype(F32)
    amax = np.abs(xb).max(-1)
    d = (amax / F32(127)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    q = np.rint(xb * inv[..., None]).astype(np.int8)
    s = (d * q.astype(np.int32).sum(-1).astype(F32)).astype(np.float16).astype(F32)
    return q.reshape(x.shape), d.astype(np.float16).astype(F32), s


def ref_q8_k(x: np.ndarray):
    """quantize_row_q8_K_ref (ggml-quants.c): codes, f32 d, bsums of 16."""
    n_tok, n = x.shape
    xb = x.reshape(n_tok, -1, 256).astype(F32)
    q = np.zeros(xb.shape, np.int8)
    d = np.zeros(xb.shape[:2], F32)
    for t in range(n_tok):
        for b in range(xb.shape[1]):
            v = xb[t, b]
            i = int(np.argmax(np.abs(v)))  # the first of largest magnitude
            if v[i] == 0:
                continue
            iscale = F32(-127) / v[i]
            q[t, b] = np.minimum(127, np.rint(iscale * v)).astype(np.int8)
            d[t, b] = F32(1) / iscale
    bsums = q.reshape(n_tok, -1, 16).astype(np.int32).sum(-1).astype(F32)
    return q.reshape(x.shape), d, bsums


def ref_vec_dot(w, x: np.ndarray) -> np.ndarray:
    """(T, n_rows) = ggml_vec_dot_<type>_<vec_dot_type> of every row with every token, float64:
    x quantised as ggml does, then per block d_w d_x (w_codes . x_codes) (+ m s_x for Q8_1),
    with the weights' d * code (- min terms) taken from gguf-py's dequantiser (exact products)."""
    vd = VEC_DOT[w.qtype]
    wf = dequant_ref(w.raw, w.qtype).astype(np.float64)
    out = np.zeros((x.shape[0], w.n_rows))
    if vd == "q8_k":
        q, d, _ = ref_q8_k(x)
        blk = 256
    else:
        q, d, s = ref_q8_blocks(x)
        blk = 32
    nb = w.n_cols // blk
    for t in range(x.shape[0]):
        qf = q[t].astype(np.float64).reshape(nb, blk)
        prod = (wf.reshape(w.n_rows, nb, blk) * qf).sum(-1) * d[t]  # (rows, nb)
        if vd == "q8_1":  # w = d q + m: ggml takes m's part as m * s_x, not m * d_x * sum(codes)
            _, type_size = GGML_QUANT_SIZES[w.qtype]
            m = (
                w.raw.reshape(w.n_rows, nb, type_size)[:, :, 2:4]
                .copy()
                .view(np.float16)[..., 0]
                .astype(np.float64)
            )
            prod += m * (s[t] - d[t].astype(np.float64) * qf.sum(-1))
        out[t] = prod.sum(-1)
    return out


# --- quantisers ---------------------------------------------------------------------------------
def _activations(n_tok: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_tok, n)) * rng.uniform(1e-6, 30, (n_tok, 1))).astype(F32)
    x[:, 32:64] = 0  # an all-zero block
    x[:, 100] = 1e-7
    # Scale 1 (amax 127): codes x exactly, with ties at .5 in both directions (round half to
    # even, not roundf); a super-block of them for Q8_K (its largest value -127: iscale 1).
    x[:, 160:192] = np.arange(32) - F32(15.5)
    x[:, 191] = 127
    if n >= 512:
        x[0, 256:512] = np.arange(256) % 32 - F32(15.5)
        x[0, 300] = -127
    return x


def test_quantize_q8_0_and_q8_1_bit_exact():
    x = _activations(3, 1024)
    x[1, 128:160] *= F32(1e-4)
    for fn, with_s in ((_q8.quantize_q8_0, False), (_q8.quantize_q8_1, True)):
        xq, xd, xs = fn(x)
        q, d, s = ref_q8_blocks(x)
        np.testing.assert_array_equal(xq, q)
        assert (xd.view(np.uint32) == d.view(np.uint32)).all()
        if with_s:
            assert (xs.view(np.uint32) == s.view(np.uint32)).all()


def test_quantize_q8_0_near_gguf():
    """gguf-py's Q8_0 is quantize_row_q8_0_ref (1/d and roundf): same scales, codes at most a
    tie or an ulp apart from the x86 quantiser's (127/amax, round half to even)."""
    x = np.random.default_rng(5).standard_normal((4, 2048)).astype(F32)
    xq, xd, _ = _q8.quantize_q8_0(x)
    blocks = gguf_quantize(x, T.Q8_0).reshape(4, -1, 34)
    d = blocks[:, :, :2].copy().view(np.float16)[..., 0].astype(F32)
    q = blocks[:, :, 2:].copy().view(np.int8).reshape(4, -1)
    np.testing.assert_array_equal(xd, d)
    diff = np.abs(xq.astype(int) - q)
    assert diff.max() <= 1 and (diff != 0).mean() < 1e-3


def test_quantize_q8_k_bit_exact():
    x = _activations(3, 1024, seed=1)
    x[2, 256:512] = 0
    xq, xd, xs = _q8.quantize_q8_k(x)
    q, d, bs = ref_q8_k(x)
    np.testing.assert_array_equal(xq, q)
    assert (xd.view(np.uint32) == d.view(np.uint32)).all()
    np.testing.assert_array_equal(xs, bs)


def test_f16_round_matches_numpy():
    rng = np.random.default_rng(3)
    v = np.concatenate(
        [
            rng.standard_normal(5000) * 10.0 ** rng.integers(-9, 6, 5000),
            [0.0, -0.0, 65504.0, 65519.0, 65520.0, 6.1e-5, 5.96e-8, 2.98e-8, 1e-30],
        ]
    )
    v = v.astype(F32)
    got = np.array([_q8.f16_round(a) for a in v], F32)
    with np.errstate(over="ignore"):
        want = v.astype(np.float16).astype(F32)
    assert (got.view(np.uint32) == want.view(np.uint32)).all()


# --- integer mat-vecs ---------------------------------------------------------------------------
def _ref_scale(w, x):
    """Sum over the terms of ref_vec_dot of their magnitude (the float rounding's scale)."""
    return np.abs(x).astype(np.float64) @ np.abs(dequant_ref(w.raw, w.qtype).astype(np.float64)).T


@pytest.mark.int8
@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_int8_matvec_matches_ggml(qtype):
    """matvec, matvec_many and matvec_multi (1..7 tokens) equal ggml's vec_dot to float rounding."""
    w = make_tensor(qtype, 37, _cols(qtype), seed=11)
    x = _activations(7, w.n_cols, seed=12)
    ref = ref_vec_dot(w, x)
    tol = 2e-6 * _ref_scale(w, x) + 1e-30
    out = np.full(w.n_rows, np.nan, F32)
    quants.matvec(w, x[0], out)
    assert (np.abs(out - ref[0]) <= tol[0]).all()
    outs = [np.full(w.n_rows, np.nan, F32) for _ in range(3)]
    quants.matvec_many([w, w, w], x[1], outs)
    for o in outs:
        assert (np.abs(o - ref[1]) <= tol[1]).all()
    for n_tok in (1, 2, 3, 4, 5, 7):
        om = np.full((n_tok, w.n_rows), np.nan, F32)
        quants.matvec_multi(w, x[:n_tok], om)
        assert (np.abs(om - ref[:n_tok]) <= tol[:n_tok]).all(), n_tok
        assert (om[0] == out).all()  # one token the same bits alone or in a batch


@pytest.mark.int8
@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_prefill_sees_the_activations_decode_sees(qtype):
    """The BLAS prefill (more than MATVEC_MAX_TOKENS tokens) multiplies x rounded to the type's
    vec_dot grid, so each token's result equals its int8 mat-vec to summation order: a prompt
    prefilled or a cached prefix plus one decoded token give the same logits. Without the
    rounding the two differ by x's 8-bit quantisation error (~0.5 %)."""
    w = make_tensor(qtype, 64, _cols(qtype) * 2, seed=5)
    n_tok = quants.MATVEC_MAX_TOKENS + 4
    x = np.random.default_rng(6).standard_normal((n_tok, w.n_cols)).astype(F32)
    prefill = np.empty((n_tok, w.n_rows), F32)
    quants.matmul(w, x, prefill)
    decode = np.empty((n_tok, w.n_rows), F32)
    for t in range(n_tok):
        quants.matvec_multi(w, x[t : t + 1], decode[t : t + 1])
    assert nerr(prefill, decode) < 1e-5


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_int8_close_to_float_path(qtype):
    """The int8 path differs from the exact float path by x's quantisation error only."""
    w = make_tensor(qtype, 64, _cols(qtype) * 2, seed=3)
    x = np.random.default_rng(4).standard_normal((2, w.n_cols)).astype(F32)
    y = {}
    for on in (False, True):
        y[on] = np.empty((2, w.n_rows), F32)
        quants.matvec_multi(w, x, y[on], "int8" if on else "float")
    err = nerr(y[True], y[False])
    assert 1e-4 < err < 2e-2  # Q8 has 8 bits: ~0.5 %; 0 would mean the float path ran


def test_int8_switch():
    """GGSTATION_INT8 makes the int8 path the default (else the two-plane path, "x16"),
    GGSTATION_NO_INT8 the float oracle, whatever GGSTATION_INT8 says."""
    code = "from engine import quants, jit; print(jit.INT8, quants.default_decode_path())"
    for on, off, want in (
        ("", "", "False x16"),
        ("1", "", "True int8"),
        ("0", "", "False x16"),
        ("1", "1", "False float"),
        ("1", "0", "True int8"),
        ("", "1", "False float"),
    ):
        env = {
            k: v for k, v in os.environ.items() if k not in ("GGSTATION_INT8", "GGSTATION_NO_INT8")
        }
        r = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**env, "GGSTATION_INT8": on, "GGSTATION_NO_INT8": off},
            check=True,
        )
        assert r.stdout.split() == want.split(), (on, off)


def test_dense_types_keep_the_float_path():
    for qtype in DENSE:
        assert quants.QUANT_TYPES[qtype].matvec_i8 is None


# --- instruction selection ----------------------------------------------------------------------
_FEATS = _ir._target_features(numba.core.registry.cpu_target.target_context)
_AVX2 = "+avx2" in _FEATS


def _dot_kernel(row):
    from numba import njit

    @njit
    def dot(raw, xq, xd, xs, out):
        for r in range(raw.shape[0]):
            row(raw, r, xq, xd, xs, out, 0)

    return dot


def test_int8_instruction_paths(monkeypatch):
    """vpdpbusd (VNNI, unscaled parts), pmaddubsw + pmaddwd (AVX2), their 512-bit forms on two
    blocks or parts at once (AVX-512) and the portable IR (no x86 intrinsics) give the same
    integers in the same lanes and the same float operations, hence the same results bit for
    bit, for one token and for several."""
    if not _AVX2:
        pytest.skip("this CPU has no AVX2")
    from engine.quants import k_quants, q4_0, q4_1

    modes = {"portable": (False, False, False), "avx2": (True, False, False)}
    if _ir._use_vnni(_FEATS):
        modes["vnni"] = (True, True, False)
    if _ir._use_avx512(_FEATS):
        modes["avx512"] = (True, False, True)
        if "+avx512vnni" in _FEATS:
            modes["avx512-vnni"] = (True, True, True)
    for layout, qtype in (
        (q4_0.Q4_0Layout(), T.Q4_0),
        (q4_1.Q4_1Layout(), T.Q4_1),
        (k_quants.Q6_KLayout(), T.Q6_K),
    ):
        w = make_tensor(
            qtype, 9, 224 if qtype != T.Q6_K else 768, seed=2
        )  # 7 blocks: a pair left over
        x = np.random.default_rng(1).standard_normal((3, w.n_cols)).astype(F32)
        quant = {"q8_0": _q8.quantize_q8_0, "q8_1": _q8.quantize_q8_1, "q8_k": _q8.quantize_q8_k}[
            VEC_DOT[qtype]
        ]
        xq, xd, xs = quant(x)
        res = {}
        for mode, (avx2, vnni, wide) in modes.items():
            monkeypatch.setattr(_ir, "_use_avx2", lambda feats, a=avx2: a)
            monkeypatch.setattr(_ir, "_use_vnni", lambda feats, v=vnni: v)
            monkeypatch.setattr(_ir, "_use_avx512", lambda feats, z=wide: z)
            for n_tok in (1, 3):
                dot = _dot_kernel(_ir.make_row_dot_i8(layout, n_tok))
                out = np.empty((3, w.n_rows), F32)
                dot(w.raw, xq[:n_tok], xd[:n_tok], xs[:n_tok], out[:n_tok])
                res[mode, n_tok] = out[:n_tok]
            ir_text = dot.inspect_llvm(dot.signatures[0])
            asm = dot.inspect_asm(dot.signatures[0])
            maddubs = avx2 and (not vnni or qtype == T.Q6_K)
            # (the 7th 32-weight block has no partner: the 256-bit form serves it)
            assert ("llvm.x86.avx2.pmadd.ub.sw" in ir_text) == (
                maddubs and (not wide or qtype != T.Q6_K)
            )
            assert ("llvm.x86.avx512.pmaddubs.w.512" in ir_text) == (maddubs and wide)
            assert ("vpdpbusd" in asm) == (vnni and qtype != T.Q6_K)  # Q6_K's parts are scaled
            if avx2 and not vnni:
                assert "vpmaddubsw" in asm
        for mode in modes:
            np.testing.assert_array_equal(res[mode, 1], res["portable", 1], err_msg=mode)
            np.testing.assert_array_equal(res[mode, 3], res["portable", 3], err_msg=mode)
            np.testing.assert_array_equal(res[mode, 3][0], res[mode, 1][0], err_msg=mode)


@OTHER_TARGETS
@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_portable_int8_lowers_on_other_targets(qtype, triple, cpu, features):
    """A block's portable int8 IR (widening multiplies, no x86 intrinsics) compiles for other
    targets to straight-line code."""
    from llvmlite import ir

    target, mod = module_for(triple)
    fn = ir.Function(
        mod,
        ir.FunctionType(
            ir.VoidType(), [_ir.I8.as_pointer(), _ir.I8.as_pointer(), _ir.V8F.as_pointer()]
        ),
        "block",
    )
    builder = ir.IRBuilder(fn.append_basic_block())
    em = _ir.Emit(builder)  # no F16C, no pshufb, no AVX2
    layout = importlib.import_module(f"engine.quants.generated.{qtype.name.lower()}")._layout
    ib = layout.int_block(em, fn.args[0])
    isum = None
    for part in ib.parts:
        y = em.load(fn.args[1], part.e0, _ir.V32I8)
        v = em.idot(part.w, y, part.signed, part.scales)
        isum = v if isum is None else builder.add(isum, v)
    res = em.fmul(em.splat(ib.d, _ir.V8F), builder.sitofp(isum, _ir.V8F))
    builder.store(res, fn.args[2], align=4)
    builder.ret_void()
    body, calls = lowered_ops(target, mod, cpu, features)
    assert len(body) > 20 and not calls


def test_int8_flags():
    """`--int8` / `--no-int8` on the model-running commands choose the decode path of the
    parameters (CommonParams, then ContextParams); the last wins; parsing changes no default."""
    from engine.cli import build_parser, parse_args
    from engine.params import common_params, to_context_params

    parser = build_parser()
    was = quants.default_decode_path()
    args = parse_args(parser, ["bench", "-m", "smollm2"])
    assert args.decode_path is None
    for cmd in ("bench", "generate", "perplexity", "serve", "chat"):
        extra = ["-f", "text.txt"] if cmd == "perplexity" else []
        args = parse_args(parser, [cmd, "-m", "smollm2", "--int8", *extra])
        assert args.decode_path == "int8", cmd
        args = parse_args(parser, [cmd, "-m", "smollm2", "--int8", "--no-int8", *extra])
        assert args.decode_path == "float", cmd
    for cmd in (
        "generate",
        "serve",
        "chat",
    ):  # the commands that build their context from CommonParams
        args = parse_args(parser, [cmd, "-m", "smollm2", "--no-int8"])
        assert to_context_params(common_params(args)).decode_path == "float", cmd
    assert quants.default_decode_path() == was
