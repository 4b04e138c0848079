"""Fast kernels in engine.quants against the gguf-py oracle (engine.quants.reference).

These pin the float path (weights unpacked to float32, exact to float rounding), which decode
runs under GGSTATION_NO_INT8=1 and which is the oracle of the int8 path
(tests/test_quants_int8.py): tests/conftest.py runs these with the int8 path off.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize as gguf_quantize

from engine import jit, quants
from engine.errors import UnsupportedQuantError
from engine.quants import QTensor, _ir, _kern, iq4, mxfp4
from engine.quants.reference import dequant_ref
from sweeps import sweep

LEGACY = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
KQUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
TABLES = [T.IQ4_NL, T.IQ4_XS, T.MXFP4]  # 4-bit codes through a 16-entry table (Emit.lut16)
DENSE = [T.F32, T.F16, T.BF16]
ALL = DENSE + LEGACY + KQUANTS + TABLES
SUPER = KQUANTS + [T.IQ4_XS]  # 256-weight super-blocks

# Byte offsets of the f16 (super-)scales inside each block given random bytes: K-quants' d and
# dmin, IQ4's d; MXFP4's E8M0 byte (offset 0) is drawn separately.
_RANDOM_F16 = {
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ4_NL: (0,),
    T.IQ4_XS: (0,),
    T.MXFP4: (),
}


def make_tensor(qtype: T, n_rows: int, n_cols: int, seed: int = 0) -> QTensor:
    rng = np.random.default_rng(seed)
    if qtype in DENSE:
        data = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
        if qtype == T.F32:
            raw = data
        elif qtype == T.F16:
            raw = data.astype(np.float16)
        else:
            raw = (data.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_rows, -1)
    elif qtype in LEGACY:
        data = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
        raw = gguf_quantize(data, qtype)
    else:
        block, size = GGML_QUANT_SIZES[qtype]
        nb = n_cols // block
        raw = rng.integers(0, 256, (n_rows, nb, size), dtype=np.uint8)
        for off in _RANDOM_F16[qtype]:
            scale = rng.uniform(0.001, 0.05, (n_rows, nb)).astype(np.float16)
            raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(n_rows, nb, 2)
        if qtype == T.MXFP4:  # E8M0 scales 2^-10 .. 2^1
            raw[:, :, 0] = rng.integers(117, 129, (n_rows, nb))
        raw = raw.reshape(n_rows, nb * size)
    raw = np.ascontiguousarray(raw)
    raw.flags.writeable = False  # the mmap views the model gives us are read-only
    return QTensor("test.weight", qtype, n_rows, n_cols, raw)


def nerr(y, ref):
    return float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))


def _cols(qtype):
    return 512 if qtype in SUPER else 320


def test_every_type_is_tested():
    """ALL parametrises the tests below: a type added to QUANT_TYPES must be added here too."""
    assert set(ALL) == set(quants.QUANT_TYPES)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_dequant_exact(qtype):
    w = make_tensor(qtype, 37, _cols(qtype))
    ref = dequant_ref(w.raw, qtype)
    out = np.empty((w.n_rows, w.n_cols), np.float32)
    quants.dequant_rows(w, 0, w.n_rows, out)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-30)
    part = np.empty((5, w.n_cols), np.float32)
    quants.dequant_rows(w, 30, 35, part)
    np.testing.assert_allclose(part, ref[30:35], rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_get_rows(qtype):
    w = make_tensor(qtype, 21, _cols(qtype), seed=1)
    ref = dequant_ref(w.raw, qtype)
    ids = np.array([3, 0, 20, 3], np.int32)
    out = np.empty((4, w.n_cols), np.float32)
    quants.get_rows(w, ids, out)
    np.testing.assert_allclose(out, ref[ids], rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_matvec(qtype):
    w = make_tensor(qtype, 67, _cols(qtype), seed=2)
    x = np.random.default_rng(3).standard_normal(w.n_cols).astype(np.float32)
    ref = dequant_ref(w.raw, qtype).astype(np.float64) @ x
    out = np.empty(w.n_rows, np.float32)
    quants.matvec(w, x, out)
    assert nerr(out, ref) < 1e-5


@pytest.mark.parametrize("n_tok", [1, 3, 6, 37])
@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_matmul(qtype, n_tok):
    w = make_tensor(qtype, 45, _cols(qtype), seed=4)
    x = np.random.default_rng(5).standard_normal((n_tok, w.n_cols)).astype(np.float32)
    ref = x.astype(np.float64) @ dequant_ref(w.raw, qtype).astype(np.float64).T
    out = np.full((n_tok, w.n_rows), np.nan, np.float32)
    quants.matmul(w, x, out, np.empty(quants.TILE_ROWS * w.n_cols, np.float32))
    assert nerr(out, ref) < 1e-5


@pytest.mark.parametrize("qtype", [T.Q4_K, *TABLES], ids=lambda t: t.name)
def test_matvec_multi_matches_single(qtype):
    w = make_tensor(qtype, 33, 512, seed=6)
    x = np.random.default_rng(7).standard_normal((7, 512)).astype(np.float32)
    out = np.empty((7, 33), np.float32)
    quants.matvec_multi(w, x, out)
    for t in range(7):
        one = np.empty(33, np.float32)
        quants.matvec(w, x[t], one)
        np.testing.assert_allclose(out[t], one, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("int8", [True, False], ids=["int8", "float"])
@pytest.mark.parametrize("qtype", sweep(ALL, fast={T.Q4_0, T.Q8_0, T.Q4_K}, ids=lambda t: t.name))
def test_matvec_multi_many_matches_matvec_multi(qtype, int8):
    """The fused launch for weights sharing x (Q/K/V, gate/up of several slots' tokens) gives
    each weight the bits matvec_multi gives it alone, for 2..8 tokens and 1..3 weights."""
    ws = [make_tensor(qtype, n, _cols(qtype), seed=20 + n) for n in (37, 16, 5)]
    x = np.random.default_rng(8).standard_normal((8, ws[0].n_cols)).astype(np.float32)
    path = "int8" if int8 else "float"
    for n_tok, n_w in ((2, 3), (3, 1), (4, 3), (5, 2), (8, 3)):
        outs = [np.full((n_tok, w.n_rows), np.nan, np.float32) for w in ws[:n_w]]
        quants.matvec_multi_many(ws[:n_w], x[:n_tok], outs, path)
        for w, o in zip(ws[:n_w], outs, strict=True):
            alone = np.full((n_tok, w.n_rows), np.nan, np.float32)
            quants.matvec_multi(w, x[:n_tok], alone, path)
            np.testing.assert_array_equal(o, alone, err_msg=f"{n_tok} tokens, {n_w} weights")


def test_matmul_many_fuses_few_tokens_and_mixed_types(monkeypatch):
    """matmul_many of 2..8 tokens: one fused launch per type (a Q8_0 V beside Q4_K Q/K: two),
    the same results as matmul on each."""
    ws = [
        make_tensor(T.Q4_K, 24, 512, seed=1),
        make_tensor(T.Q4_K, 8, 512, seed=2),
        make_tensor(T.Q8_0, 8, 512, seed=3),
    ]
    x = np.random.default_rng(9).standard_normal((4, 512)).astype(np.float32)
    launches = []
    real = quants._multi_same_x

    def spy(qt, rp, path):
        launches.append(qt.qtype)
        return real(qt, rp, path)

    monkeypatch.setattr(quants, "_multi_same_x", spy)
    outs = [np.empty((4, w.n_rows), np.float32) for w in ws]
    quants.matmul_many(ws, x, outs)
    assert launches == [T.Q4_K, T.Q8_0]
    for w, o in zip(ws, outs, strict=True):
        alone = np.empty((4, w.n_rows), np.float32)
        quants.matmul(w, x, alone)
        np.testing.assert_array_equal(o, alone)


def test_check_supported():
    for qt in ALL:
        quants.check_supported("ok.weight", qt)
    with pytest.raises(UnsupportedQuantError, match=r"blk\.3\.ffn_up\.weight.*IQ2_XXS"):
        quants.check_supported("blk.3.ffn_up.weight", T.IQ2_XXS)


def test_bad_inputs_raise():
    w = make_tensor(T.Q4_1, 8, 64)
    qt = quants.QUANT_TYPES[T.Q4_1]
    out = np.empty(8, np.float32)
    with pytest.raises(TypeError, match="float32"):
        quants.matvec(w, np.zeros(64, np.float64), out)
    with pytest.raises(ValueError, match="shape"):
        quants.matvec(w, np.zeros(32, np.float32), out)
    with pytest.raises(ValueError, match="contiguous"):
        quants.matvec(w, np.zeros(128, np.float32)[::2], out)
    with pytest.raises(ValueError, match="contiguous"):
        qt.matvec(np.zeros((8, 80), np.uint8)[:, ::2], np.zeros(64, np.float32), out)
    with pytest.raises(ValueError, match="out"):
        quants.matvec(w, np.zeros(64, np.float32), np.empty(7, np.float32))
    with pytest.raises(ValueError, match="out"):
        quants.dequant_rows(w, 0, 8, np.empty((8, 64), np.float32)[:, ::1].T.copy().T)
    with pytest.raises(ValueError, match="out of range"):
        quants.get_rows(w, np.array([8]), np.empty((1, 64), np.float32))


@pytest.mark.model
@pytest.mark.parametrize(
    "name",
    [
        "blk.0.attn_output.weight",
        "blk.0.ffn_down.weight",
        "blk.0.ffn_up.weight",
        "blk.0.attn_v.weight",
    ],
)
def test_real_gemma_tensors(name, gemma3_path):
    """Real K-quant tensors (Q4_K, Q6_K, Q5_0, Q8_0) of the gemma starter model."""
    from engine.gguf_file import GGUFFile

    f = GGUFFile(gemma3_path)
    w = f.qtensor(name)
    rows = slice(0, 96)
    sub = QTensor(w.name, w.qtype, 96, w.n_cols, w.raw[rows])
    ref = dequant_ref(sub.raw, w.qtype)
    out = np.empty((96, w.n_cols), np.float32)
    quants.dequant_rows(sub, 0, 96, out)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-30)
    x = np.random.default_rng(8).standard_normal((3, w.n_cols)).astype(np.float32)
    y = np.empty((3, 96), np.float32)
    quants.matmul(sub, x, y)
    assert nerr(y, x.astype(np.float64) @ ref.astype(np.float64).T) < 1e-5


@pytest.mark.parametrize(
    "qtype", [T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.F16, *TABLES], ids=lambda t: t.name
)
def test_matvec_many(qtype):
    cols = _cols(qtype)
    ws = [make_tensor(qtype, n, cols, seed=10 + n) for n in (40, 16, 24, 8)]
    ws.append(make_tensor(T.Q8_0 if qtype != T.Q8_0 else T.Q4_0, 12, cols, seed=9))  # mixed types
    x = np.random.default_rng(11).standard_normal(cols).astype(np.float32)
    outs = [np.full(w.n_rows, np.nan, np.float32) for w in ws]
    quants.matvec_many(ws, x, outs)
    for w, o in zip(ws, outs, strict=True):
        ref = dequant_ref(w.raw, w.qtype).astype(np.float64) @ x
        assert nerr(o, ref) < 1e-5


@pytest.mark.parametrize("n_tok", [1, 2, 9])
def test_matmul_many_and_warmup(n_tok):
    ws = [
        make_tensor(T.Q4_1, 24, 64, seed=20),
        make_tensor(T.Q4_1, 8, 64, seed=21),
        make_tensor(T.Q8_0, 16, 64, seed=22),
    ]
    for w in ws:
        quants.warmup(w)
    x = np.random.default_rng(23).standard_normal((n_tok, 64)).astype(np.float32)
    outs = [np.full((n_tok, w.n_rows), np.nan, np.float32) for w in ws]
    quants.matmul_many(ws, x, outs, np.empty(quants.TILE_ROWS * 64, np.float32))
    for w, o in zip(ws, outs, strict=True):
        assert (
            nerr(o, x.astype(np.float64) @ dequant_ref(w.raw, w.qtype).astype(np.float64).T) < 1e-5
        )


@pytest.mark.parametrize("qtype", DENSE + LEGACY + TABLES, ids=lambda t: t.name)
def test_odd_block_count(qtype):
    """Rows with an odd number of blocks exercise the tail after the paired-block loop."""
    cols = 48 if qtype in DENSE else 768 if qtype in SUPER else 96
    w = make_tensor(qtype, 5, cols, seed=30)
    x = np.random.default_rng(31).standard_normal((2, cols)).astype(np.float32)
    ref = x.astype(np.float64) @ dequant_ref(w.raw, qtype).astype(np.float64).T
    out = np.empty((2, 5), np.float32)
    quants.matmul(w, x, out)
    assert nerr(out, ref) < 1e-5
    one = np.empty(5, np.float32)
    quants.matvec(w, x[1], one)
    assert nerr(one, ref[1]) < 1e-5


def test_every_half_value_converts_exactly():
    """All 65536 f16 bit patterns (subnormals, inf, nan included) through the F16 kernel."""
    vals = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(-1, 64)
    raw = np.ascontiguousarray(vals)
    raw.flags.writeable = False
    w = QTensor("w", T.F16, raw.shape[0], 64, raw)
    out = np.empty((raw.shape[0], 64), np.float32)
    quants.dequant_rows(w, 0, raw.shape[0], out)
    ref = vals.astype(np.float32)
    same = (out.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(out) & np.isnan(ref))
    assert same.all()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # gguf-py's 2^127 * 12
def test_every_e8m0_scale_converts_exactly():
    """All 256 E8M0 scale bytes (the two subnormal ones and 2^127 included) through MXFP4."""
    rng = np.random.default_rng(40)
    raw = rng.integers(0, 256, (8, 32, 17), dtype=np.uint8)
    raw[:, :, 0] = np.arange(256, dtype=np.uint8).reshape(8, 32)
    raw = np.ascontiguousarray(raw.reshape(8, -1))
    raw.flags.writeable = False
    out = np.empty((8, 1024), np.float32)
    quants.dequant_rows(QTensor("w", T.MXFP4, 8, 1024, raw), 0, 8, out)
    ref = dequant_ref(raw, T.MXFP4)
    assert (out.view(np.uint32) == ref.view(np.uint32)).all()


def _fresh_kernels(layout):
    """Uncached njit kernels over `layout`'s row intrinsics (dequant, 2-token dot), so that each
    compiles with the lookup path jit.PORTABLE_LUT says at its first call."""
    row_dequant = _ir.make_row_dequant(layout)
    row_dot = _ir.make_row_dot(layout, 2)

    @numba.njit(cache=False)
    def dequant(raw, out):
        for r in range(raw.shape[0]):
            row_dequant(raw, r, out, r)

    @numba.njit(cache=False)
    def dot(raw, x, xs, out):
        for r in range(raw.shape[0]):
            row_dot(raw, r, x, xs, out, 0)

    return dequant, dot


_LAYOUTS = {T.IQ4_NL: iq4.IQ4_NLLayout, T.IQ4_XS: iq4.IQ4_XSLayout, T.MXFP4: mxfp4.MXFP4Layout}


_SSSE3 = "+ssse3" in _ir._target_features(numba.core.registry.cpu_target.target_context)


@pytest.mark.parametrize("pshufb", [False, True], ids=["portable", "pshufb"])
@pytest.mark.parametrize("qtype", TABLES, ids=lambda t: t.name)
def test_table_lookup_paths(qtype, pshufb, monkeypatch):
    """Both table lookups (the select tree, pshufb) against gguf-py: the dequantised weights
    bit for bit, the dot products to float tolerance."""
    if pshufb and not _SSSE3:
        pytest.skip("this CPU has no SSSE3")
    monkeypatch.setattr(_ir, "_use_pshufb", lambda feats: pshufb)
    layout = _LAYOUTS[qtype]()
    w = make_tensor(qtype, 19, _cols(qtype), seed=41)
    x = np.random.default_rng(42).standard_normal((2, w.n_cols)).astype(np.float32)
    dequant, dot = _fresh_kernels(layout)
    out = np.empty((w.n_rows, w.n_cols), np.float32)
    dequant(w.raw, out)
    ref = dequant_ref(w.raw, qtype)
    assert (out.view(np.uint32) == ref.view(np.uint32)).all()
    y = np.full((2, w.n_rows), np.nan, np.float32)
    dot(w.raw, x, _kern.group_sums(x, layout.group), y)
    assert nerr(y, x.astype(np.float64) @ ref.astype(np.float64).T) < 1e-5
    for kernel in (dequant, dot):
        ir = kernel.inspect_llvm(kernel.signatures[0])
        assert ("llvm.x86.ssse3.pshuf.b.128" in ir) == pshufb


def test_lookup_follows_target_and_switch(monkeypatch):
    """pshufb where the compile target has SSSE3, unless GGSTATION_PORTABLE_LUT
    (jit.PORTABLE_LUT) asks for the portable lookup."""
    assert _ir._use_pshufb("+sse2,+ssse3,+avx2")
    assert not _ir._use_pshufb("+sse2,-ssse3")
    assert not _ir._use_pshufb("+neon")
    monkeypatch.setattr(jit, "PORTABLE_LUT", True)
    assert not _ir._use_pshufb("+sse2,+ssse3,+avx2")


def test_portable_lut_compiles_uncached(monkeypatch):
    """Kernels built with the portable lookup never enter numba's cache, whose key does not
    know the switch (the cached native kernels would otherwise be served, or overwritten)."""
    from engine.quants.generated import iq4_nl

    deps = (_ir, _kern, iq4)
    digest = jit.source_digest(m.__file__ for m in deps)
    assert jit.generated_kernel(iq4_nl.__file__, deps, digest) is jit.parallel_kernel
    monkeypatch.setattr(jit, "PORTABLE_LUT", True)
    decorate = jit.generated_kernel(iq4_nl.__file__, deps, digest)
    assert decorate is not jit.parallel_kernel
    assert type(decorate(lambda a: a + 1)._cache).__name__ == "NullCache"


# Targets this machine is not, for the portable IR paths.
OTHER_TARGETS = pytest.mark.parametrize(
    "triple, cpu, features",
    [
        ("aarch64-unknown-linux-gnu", "generic", "+neon"),  # an ARM build: NEON, no pshufb
        ("x86_64-unknown-linux-gnu", "x86-64", "+sse2"),  # the x86-64 baseline: no SSSE3
    ],
    ids=["aarch64", "x86-64-sse2"],
)


def module_for(triple: str):
    """(llvmlite target, empty IR module) for `triple`; skips where llvmlite lacks the target."""
    import llvmlite.binding as llvm
    from llvmlite import ir

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        target = llvm.Target.from_triple(triple)
    except RuntimeError:
        pytest.skip(f"this llvmlite has no {triple} target")
    mod = ir.Module()
    mod.triple = triple
    return target, mod


def lowered_ops(target, mod, cpu: str, features: str) -> tuple[list[str], list[str]]:
    """The instruction mnemonics `mod` compiles to for the target, and the calls among them."""
    import llvmlite.binding as llvm

    tm = target.create_target_machine(cpu=cpu, features=features, opt=3)
    m = llvm.parse_assembly(str(mod))
    m.data_layout = str(tm.target_data)
    asm = tm.emit_assembly(m)
    body = [ln.split()[0] for ln in asm.splitlines() if ln.startswith("\t") and ln.split()]
    return body, [op for op in body if op.startswith("call") or op in ("bl", "blr")]


@OTHER_TARGETS
@pytest.mark.parametrize("qtype", TABLES, ids=lambda t: t.name)
def test_portable_lookup_lowers_on_other_targets(qtype, triple, cpu, features):
    """A block's portable IR (select-tree lookups, integer half conversion) compiles for
    targets this machine is not, to straight-line code: no calls into runtime helpers."""
    from llvmlite import ir

    target, mod = module_for(triple)
    fn = ir.Function(
        mod, ir.FunctionType(ir.VoidType(), [_ir.I8.as_pointer(), _ir.V16F.as_pointer()]), "block"
    )
    builder = ir.IRBuilder(fn.append_basic_block())
    em = _ir.Emit(builder)  # no F16C, no pshufb
    acc = em.splat(em.fconst(0.0))
    for g in _LAYOUTS[qtype]().groups(em, fn.args[0]):
        for q in g.q:
            acc = em.fadd(acc, em.fmul(em.splat(g.d), q))
    builder.store(acc, fn.args[1], align=4)
    builder.ret_void()
    body, calls = lowered_ops(target, mod, cpu, features)
    assert len(body) > 100 and not calls
