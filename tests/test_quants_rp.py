"""The int8 path's row-interleaved kernels (Layout.rp_block, _ir.make_group_dot_i8): the
repacked layout byte by byte, the mat-vecs against ggml's vec_dot (numpy transcription in
test_quants_int8) for row counts that do and do not fill the last group, every instruction
path giving the same bits, the portable IR on other targets, and bad shapes refused."""

from __future__ import annotations

import importlib
import mmap
import threading

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from engine import quants
from engine.quants import _ir, _kern, _q8, codegen
from engine.quants.base import ExpertTensor, QTensor
from tests.test_quants import OTHER_TARGETS, _cols, lowered_ops, make_tensor, module_for
from tests.test_quants_int8 import VEC_DOT, _activations, _ref_scale, ref_vec_dot

RP_TYPES = [T[s.name] for s in codegen.TYPES if s.rp]
F32 = np.float32
_QUANT = {"q8_0": _q8.quantize_q8_0, "q8_1": _q8.quantize_q8_1, "q8_k": _q8.quantize_q8_k}


def _layout(qtype):
    return importlib.import_module(f"engine.quants.generated.{qtype.name.lower()}")._layout


def test_rp_types():
    """Every quantised type has the interleaved form (each tested below); the dense ones not."""
    assert set(RP_TYPES) == {
        T.Q4_0,
        T.Q4_1,
        T.Q5_0,
        T.Q5_1,
        T.Q8_0,
        T.Q2_K,
        T.Q3_K,
        T.Q4_K,
        T.Q5_K,
        T.Q6_K,
        T.IQ4_NL,
        T.IQ4_XS,
        T.MXFP4,
    }
    for qtype, qt in quants.QUANT_TYPES.items():
        assert (qt.repack is not None) == (qtype in RP_TYPES)


@pytest.mark.parametrize("rows", [8, 16])
@pytest.mark.parametrize("qtype", RP_TYPES, ids=lambda t: t.name)
def test_repack_lays_rows_side_by_side(qtype, rows):
    """Per group and block: each plain field row after row, each chunked one in chunks (4
    bytes or 1) of every row in turn; the last group padded with zero rows; nothing else moves."""
    layout = _layout(qtype)
    bb = layout.block_bytes
    n_rows, nb = rows + 3, 3
    raw = np.random.default_rng(1).integers(0, 256, (n_rows, nb * bb), dtype=np.uint8)
    pk = _kern.repack_rows(layout, raw, rows)
    assert pk.shape == (2, nb * bb * rows) and pk.dtype == np.uint8
    offs = _ir.rp_field_offsets(layout, rows)
    padded = np.zeros((2 * rows, nb * bb), np.uint8)
    padded[:n_rows] = raw
    for g in range(2):
        for b in range(nb):
            at = b * bb * rows
            for (off, size, chunk), foff in zip(layout.rp_fields, offs, strict=True):
                for r in range(rows):
                    src = padded[g * rows + r, b * bb + off : b * bb + off + size]
                    if chunk:
                        for c in range(size // chunk):
                            dst = at + foff + c * chunk * rows + chunk * r
                            np.testing.assert_array_equal(
                                pk[g, dst : dst + chunk], src[chunk * c : chunk * (c + 1)]
                            )
                    else:
                        dst = at + foff + r * size
                        np.testing.assert_array_equal(pk[g, dst : dst + size], src)
    assert sorted(pk.ravel()) == sorted(padded.ravel())  # a permutation


def test_repack_spread_over_worker_threads_gives_the_same_bytes():
    """The copy is made in slices on the batch path's worker threads when there are several:
    the same bytes as one thread's, however many slices the rows cut into."""
    from engine import parallel

    layout = _layout(T.Q4_K)
    raw = np.random.default_rng(5).integers(
        0, 256, (16 * 9 + 5, 2 * layout.block_bytes), dtype=np.uint8
    )
    one = _kern.repack_rows(layout, raw, 16)
    before = parallel.pool_size()
    try:
        for n in (2, 3):
            parallel.set_pool_size(n)
            np.testing.assert_array_equal(_kern.repack_rows(layout, raw, 16), one)
    finally:
        parallel.set_pool_size(before)


def test_repack_releases_each_slice_of_a_mapped_weight_as_it_goes(tmp_path, monkeypatch):
    """A mapped weight's rows leave RAM slice by slice as they are copied (a big embedding's
    copy must not hold both forms whole at its peak), and the copy is still right."""
    layout = _layout(T.Q8_0)
    rows, n_rows = 16, 16 * 40 + 3
    data = np.random.default_rng(9).integers(
        0, 256, (n_rows, 64 * layout.block_bytes), dtype=np.uint8
    )
    (tmp_path / "w.bin").write_bytes(data.tobytes())
    with open(tmp_path / "w.bin", "rb") as fh:
        mapped = np.frombuffer(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)
    raw = mapped.reshape(data.shape)
    expected = _kern.repack_rows(layout, data, rows)
    released = []
    real = _kern.release_mapped_pages
    monkeypatch.setattr(_kern, "release_mapped_pages", lambda a: released.append(a) or real(a))
    np.testing.assert_array_equal(_kern.repack_rows(layout, raw, rows), expected)
    assert len(released) >= 2  # slices, each released after its copy
    assert sum(a.shape[0] for a in released) == n_rows // rows * rows  # every whole group's rows
    assert all(np.shares_memory(a, raw) for a in released)


def test_parts_run_from_a_pool_worker_run_there():
    """A part that runs parts (a copy made from inside a prefill tile) must not wait on the pool
    it occupies: with every worker doing so, none would be left to run the inner parts."""
    from engine import parallel

    before = parallel.pool_size()
    seen: list[tuple[int, int]] = []
    parallel.set_pool_size(2)
    outer = threading.Thread(
        target=parallel.run_parts,
        daemon=True,
        args=(lambda p, w: parallel.run_parts(lambda q, w2: seen.append((p, q)), 3), 2),
    )
    outer.start()
    outer.join(30)
    hung = outer.is_alive()
    if not hung:
        parallel.set_pool_size(before)  # (a hung pool is left to its daemon threads)
    assert not hung, "run_parts from inside the pool waited on itself"
    assert sorted(seen) == [(p, q) for p in range(2) for q in range(3)]


@pytest.mark.int8
@pytest.mark.parametrize("n_rows", [1, 7, 8, 16, 17, 40])
@pytest.mark.parametrize("qtype", RP_TYPES, ids=lambda t: t.name)
def test_interleaved_matvecs_match_ggml(qtype, n_rows):
    """matvec, matvec_many and matvec_multi (1..8 tokens) on the interleaved copy equal ggml's
    vec_dot to float rounding, whether the last group is full or not; a token's result is the
    same bits alone or in a batch."""
    w = make_tensor(qtype, n_rows, _cols(qtype), seed=n_rows)
    assert quants.interleaved(w, quants.QUANT_TYPES[qtype])
    x = _activations(8, w.n_cols, seed=3)
    ref = ref_vec_dot(w, x)
    tol = 2e-6 * _ref_scale(w, x) + 1e-30
    out = np.full(n_rows, np.nan, F32)
    quants.matvec(w, x[0], out)
    assert (np.abs(out - ref[0]) <= tol[0]).all()
    w2 = make_tensor(qtype, n_rows + 5, _cols(qtype), seed=99)
    outs = [
        np.full(n_rows, np.nan, F32),
        np.full(n_rows + 5, np.nan, F32),
        np.full(n_rows, np.nan, F32),
    ]
    quants.matvec_many([w, w2, w], x[1], outs)
    assert (np.abs(outs[0] - ref[1]) <= tol[1]).all() and (outs[0] == outs[2]).all()
    assert (np.abs(outs[1] - ref_vec_dot(w2, x[1:2])[0]) <= 2e-6 * _ref_scale(w2, x[1:2])[0]).all()
    for n_tok in range(1, 9):
        om = np.full((n_tok, n_rows), np.nan, F32)
        quants.matvec_multi(w, x[:n_tok], om)
        assert (np.abs(om - ref[:n_tok]) <= tol[:n_tok]).all(), n_tok
        assert (om[0] == out).all()
        oms = [np.full((n_tok, n_rows), np.nan, F32), np.full((n_tok, n_rows + 5), np.nan, F32)]
        quants.matvec_multi_many([w, w2], x[:n_tok], oms)
        assert (oms[0] == om).all()


@pytest.mark.int8
def test_packed_copy_is_made_once_and_counted():
    w = make_tensor(T.Q4_1, 20, 64)
    assert w.packed_nbytes == 0  # not made until the int8 path needs it
    quants.matvec(w, np.ones(64, F32), np.empty(20, F32))
    pk = w.packed
    assert pk is not None and w.packed_nbytes == pk.nbytes >= w.nbytes
    quants.matvec(w, np.ones(64, F32), np.empty(20, F32))
    assert w.packed is pk


def test_float_path_and_expert_slices_keep_the_raw_rows():
    w = make_tensor(T.Q8_0, 16, 64)
    quants.matvec(w, np.ones(64, F32), np.empty(16, F32), "float")
    assert w.packed_nbytes == 0
    raw = np.zeros((3 * 16, 2 * 34), np.uint8)
    stack = ExpertTensor("exps", T.Q8_0, 3, 16, 64, raw)
    e = stack.expert(1)
    assert not e.pack and e.packed is None
    assert not quants.interleaved(e, quants.QUANT_TYPES[T.Q8_0], "x16")


@pytest.mark.int8
@pytest.mark.parametrize("qtype", RP_TYPES, ids=lambda t: t.name)
def test_bad_shapes_raise(qtype):
    """The kernels check the packed shape: raw rows, a wrong width or row count raise."""
    qt = quants.QUANT_TYPES[qtype]
    n = _cols(qtype)
    w = make_tensor(qtype, 24, n)
    pk = qt.repack(w.raw)
    x = np.ones((2, n), F32)
    with pytest.raises(ValueError):
        qt.matvec_multi_rp(pk, np.ones((2, n // 2), F32), np.empty((2, 24), F32))
    with pytest.raises(ValueError):
        qt.matvec_multi_rp(pk, x, np.empty((2, 24 + 32), F32))
    with pytest.raises(ValueError):
        qt.matvec_multi_rp(w.raw, x, np.empty((2, 24), F32))
    with pytest.raises(ValueError):
        qt.matvec_rp(pk, np.ones(n, F32), np.empty(25 + 32, F32))
    with pytest.raises(ValueError):
        qt.repack(w.raw[:, :-1])


# --- instruction selection ----------------------------------------------------------------------
_FEATS = _ir._target_features(numba.core.registry.cpu_target.target_context)


def _group_kernel(gdot):
    @numba.njit
    def run(pk, xq, xd, xs, xu, out):
        for g in range(pk.shape[0]):
            gdot(pk, g, xq, xd, xs, xu, out, 0)

    return run


@pytest.mark.slow  # compiles every interleaved kernel of each instruction path: ~45 s
def test_interleaved_instruction_paths(monkeypatch):
    """vpdpbusd (VNNI: signed weights flipped to unsigned, 128 * sum(x) taken off), pmaddubsw +
    pmaddwd (AVX2: signed weights through the sign trick), their 512-bit forms (16 rows a
    group instead of 8) and the portable IR give the same integers and the same float
    operations per row, hence the same bits, for one token and for several."""
    if "+avx2" not in _FEATS:
        pytest.skip("this CPU has no AVX2")
    modes = {"portable": (False, False, False), "avx2": (True, False, False)}
    if _ir._use_vnni(_FEATS):
        modes["vnni"] = (True, True, False)
    if _ir._use_avx512(_FEATS):
        modes["avx512"] = (True, False, True)
        if "+avx512vnni" in _FEATS:
            modes["avx512-vnni"] = (True, True, True)
    for qtype in RP_TYPES:
        layout = _layout(qtype)
        w = make_tensor(qtype, 21, 7 * 32 if layout.block_elems == 32 else 3 * 256, seed=4)
        x = np.random.default_rng(5).standard_normal((3, w.n_cols)).astype(F32)
        xq, xd, xs = _QUANT[VEC_DOT[qtype]](x)
        xu = _kern.code_sums(xq, layout.rp_sum_group)
        res = {}
        for mode, (avx2, vnni, wide) in modes.items():
            monkeypatch.setattr(_ir, "_use_avx2", lambda feats, a=avx2: a)
            monkeypatch.setattr(_ir, "_use_vnni", lambda feats, v=vnni: v)
            monkeypatch.setattr(_ir, "_use_avx512", lambda feats, z=wide: z)
            pk = _kern.repack_rows(layout, w.raw, 16 if wide else 8)
            for n_tok in (1, 3):
                run = _group_kernel(_ir.make_group_dot_i8(layout, n_tok))
                out = np.full((3, w.n_rows), np.nan, F32)
                run(pk, xq[:n_tok], xd[:n_tok], xs[:n_tok], xu[:n_tok], out[:n_tok])
                res[mode, n_tok] = out[:n_tok]
            asm = run.inspect_asm(run.signatures[0])
            assert ("vpdpbusd" in asm) == vnni, mode
            assert ("vpmaddubsw" in asm) == (avx2 and not vnni), mode
            assert "zmm" in asm or not wide, mode
        for mode in modes:
            np.testing.assert_array_equal(
                res[mode, 1], res["portable", 1], err_msg=f"{qtype.name} {mode}"
            )
            np.testing.assert_array_equal(
                res[mode, 3], res["portable", 3], err_msg=f"{qtype.name} {mode}"
            )
            np.testing.assert_array_equal(
                res[mode, 3][0], res[mode, 1][0], err_msg=f"{qtype.name} {mode}"
            )


@OTHER_TARGETS
@pytest.mark.parametrize("qtype", RP_TYPES, ids=lambda t: t.name)
def test_portable_interleaved_lowers_on_other_targets(qtype, triple, cpu, features):
    """An interleaved block's portable IR (8 rows, widening multiplies, the integer half
    conversion) compiles for other targets (ARM's NEON among them) to straight-line code."""
    from llvmlite import ir

    target, mod = module_for(triple)
    R = 8
    fn = ir.Function(
        mod,
        ir.FunctionType(
            ir.VoidType(),
            [_ir.I8.as_pointer(), _ir.I8.as_pointer(), ir.VectorType(_ir.F32, R).as_pointer()],
        ),
        "block",
    )
    builder = ir.IRBuilder(fn.append_basic_block())
    em = _ir.Emit(builder)  # no F16C, no AVX2
    layout = _layout(qtype)
    offs = _ir.rp_field_offsets(layout, R)
    rb = layout.rp_block(em, lambda i: builder.gep(fn.args[0], [ir.Constant(_ir.I64, offs[i])]), R)
    total = ir.Constant(ir.VectorType(_ir.I32, R), [0] * R)
    for grp in rb.groups:
        isum = ir.Constant(ir.VectorType(_ir.I32, R), [0] * R)
        for part in grp.parts:
            y = builder.bitcast(
                em.splat(em.load(fn.args[1], part.x_off, _ir.I32), ir.VectorType(_ir.I32, R)),
                ir.VectorType(_ir.I8, 4 * R),
            )
            isum = em.idot(part.w, y, part.signed, acc=isum)
        total = builder.add(total, isum if grp.scale is None else builder.mul(isum, grp.scale))
    isum = total
    res = em.fmul(rb.d, builder.sitofp(isum, ir.VectorType(_ir.F32, R)))
    builder.store(res, fn.args[2], align=4)
    builder.ret_void()
    body, calls = lowered_ops(target, mod, cpu, features)
    assert len(body) > 20 and not calls


def test_qtensor_without_form_has_no_copy():
    w = make_tensor(T.F16, 4, 256)
    assert w.packed is None and w.packed_nbytes == 0
    odd = QTensor("odd", T.Q8_0, 2, 40, np.zeros((2, 34), np.uint8))  # n_cols not whole blocks
    assert odd.packed is None


@pytest.mark.int8
def test_memory_report_counts_the_copies(tmp_path):
    """The context's memory report and the estimate before loading both count the copies
    the int8 and default paths make (every matrix of a Q8_0 model: the tied output head too; the estimate
    leaves out the padding of each matrix's last group of rows)."""
    from engine.batch import Batch
    from engine.context import Context, ContextParams
    from engine.model import load_model
    from engine.model_info import inspect_model
    from tests.ggufgen import write_tiny_model

    path = write_tiny_model(tmp_path / "q8.gguf", "llama", n_layer=2, n_embd=64, qtype=T.Q8_0)
    model = load_model(path)
    ctx = Context(model, ContextParams(n_ctx=64))
    assert ctx.memory_report().repacked_bytes == 0
    ctx.decode(Batch.for_sequence([1, 2, 3], 0, 0))
    report = ctx.memory_report()
    assert report.repacked_bytes == model.repacked_bytes > 0
    # the copies replace the weights' mapped pages in RAM: no more than the weights in the total
    assert (
        report.total_bytes
        == report.weights_bytes + report.kv_bytes + report.compute_bytes + report.metadata_bytes
    )
    est = inspect_model(path).estimate(n_ctx=64).repacked_bytes
    assert est <= report.repacked_bytes <= est * 1.01  # the copies' last groups are padded
    assert inspect_model(path).estimate("float", n_ctx=64).repacked_bytes == 0


@pytest.mark.parametrize("qtype", RP_TYPES, ids=lambda t: t.name)
def test_unpack_inverts_repack(qtype):
    qt = quants.QUANT_TYPES[qtype]
    w = make_tensor(qtype, 45, _cols(qtype), seed=7)
    pk = qt.repack(w.raw)
    for r0, r1 in ((0, 45), (0, 1), (3, 29), (16, 32), (44, 45), (8, 8)):
        np.testing.assert_array_equal(qt.unpack(pk, r0, r1), w.raw[r0:r1])


def test_release_mapped_pages_leaves_arrays_in_ram_alone():
    from engine.mapped_pages import release_mapped_pages

    a = np.arange(1 << 16, dtype=np.uint8)
    a.flags.writeable = False
    assert release_mapped_pages(a) == 0 and a[1000] == 1000 % 256


@pytest.mark.int8
def test_prefill_reads_the_copy_once_the_mapped_rows_are_let_go(tmp_path):
    """Once the int8 path made a weight's interleaved copy it lets the mapped pages go (they
    leave the process's resident set) and the prefill's dequantised tiles read the copy: the
    same bytes, so the same logits bit for bit."""
    from engine.batch import Batch
    from engine.context import Context, ContextParams
    from engine.memory import resident_bytes
    from engine.model import load_model
    from tests.ggufgen import write_tiny_model

    path = write_tiny_model(
        tmp_path / "q41.gguf", "llama", n_layer=2, n_embd=256, n_ff=512, qtype=T.Q4_1
    )
    model = load_model(path)
    ctx = Context(model, ContextParams(n_ctx=64))
    tokens = [1, 5, 9, 2, 7, 3, 8, 4, 6, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]  # BLAS tiles
    assert len(tokens) > quants.MATVEC_MAX_TOKENS
    before = ctx.decode(Batch.for_sequence(tokens, 0, logits_all=True)).copy()
    assert model.repacked_bytes == 0  # the prefill alone makes no copy
    resident = resident_bytes(model.gguf.maps())
    ctx.kv.clear()
    ctx.decode(Batch.for_sequence(tokens[:1], 0))  # a mat-vec: the copies are made
    assert model.repacked_bytes > 0
    if resident is not None:
        assert resident_bytes(model.gguf.maps()) < resident - model.repacked_bytes // 2
    ctx.kv.clear()
    after = ctx.decode(Batch.for_sequence(tokens, 0, logits_all=True))
    assert np.array_equal(after, before)


def test_two_planes_hold_x_to_fifteen_bits():
    """quantize_planes: d_hi q_hi + d_lo q_lo gives x back to amax / 2**16 a block (8 bits alone:
    amax / 254); zero blocks give zero scales and codes; each plane's s is d times its codes' sum."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((3, 512)) * rng.uniform(1e-4, 50, (3, 1))).astype(F32)
    x[1, 64:96] = 0
    for block in (32, 256):
        q, d, s = _q8.quantize_planes(x, block)
        assert q.shape == (6, 512) and d.shape == s.shape == (6, 512 // block)
        for t in range(3):
            rec = sum(
                (q[2 * t + p].reshape(-1, block).astype(np.float64) * d[2 * t + p][:, None])
                for p in range(2)
            )
            amax = np.abs(x[t]).reshape(-1, block).max(-1, keepdims=True)
            assert (np.abs(rec - x[t].reshape(-1, block)) <= amax / 2**15 + 1e-30).all()
            for p in range(2):
                codes = q[2 * t + p].reshape(-1, block).astype(np.int64).sum(-1)
                np.testing.assert_allclose(s[2 * t + p], d[2 * t + p] * codes, rtol=1e-6)
        if block == 32:
            assert (d[2:4, 2] == 0).all() and (q[2:4, 64:96] == 0).all()


@pytest.mark.parametrize("qtype", RP_TYPES, ids=lambda t: t.name)
def test_default_path_is_float_grade(qtype):
    """The default path (two planes against the interleaved copy) against the exact float64
    product: within 2e-5 of the sum of the terms' magnitudes, where the 8-bit path is ~1e-3
    off; one token gives the same bits alone or in a batch."""
    from engine.quants.reference import dequant_ref

    assert quants.default_decode_path() == "x16"
    w = make_tensor(qtype, 29, _cols(qtype), seed=8)
    x = np.random.default_rng(9).standard_normal((5, w.n_cols)).astype(F32)
    wf = dequant_ref(w.raw, qtype).astype(np.float64)
    ref, scale = x.astype(np.float64) @ wf.T, np.abs(x).astype(np.float64) @ np.abs(wf).T
    out = np.full((5, 29), np.nan, F32)
    quants.matvec_multi(w, x, out)
    assert (np.abs(out - ref) <= 2e-5 * scale).all()
    one = np.full(29, np.nan, F32)
    quants.matvec(w, x[2], one)
    assert (one == out[2]).all()
    quants.matvec_multi(w, x, out, "int8")
    assert (np.abs(out - ref) > 1e-4 * scale).any()  # 8 bits: the two planes do matter


@pytest.mark.parametrize("path", ["x16", "float"])
def test_a_short_prompt_gives_the_bits_of_its_tokens_decoded_one_by_one(
    tmp_path, path, monkeypatch
):
    """Up to MATVEC_MAX_TOKENS tokens a ubatch runs the decode kernels, which compute each
    token alone: the prompt's last logits, and every token after it, are the same bits whether
    the prompt was prefilled or its last token decoded after a cached prefix (what a server's
    prompt cache does)."""
    from engine.batch import Batch
    from engine.context import Context, ContextParams
    from engine.model import load_model
    from tests.ggufgen import write_tiny_model

    monkeypatch.setenv("GGSTATION_STEP", "1")
    model = load_model(
        write_tiny_model(
            tmp_path / "m.gguf", "llama", n_layer=2, n_embd=256, n_ff=512, qtype=T.Q4_0
        )
    )
    ctx = Context(model, ContextParams(n_ctx=64, decode_path=path))
    prompt = [1, 7, 3, 9, 4, 12, 5, 8, 2, 11, 6]
    assert 8 < len(prompt) <= quants.MATVEC_MAX_TOKENS
    a = [ctx.decode(Batch.for_sequence(prompt, 0))[0].copy()]
    a += [
        ctx.decode(Batch.for_sequence([t], len(prompt) + i))[0].copy()
        for i, t in enumerate((4, 9, 1))
    ]
    ctx.kv.clear()
    ctx.decode(Batch.for_sequence(prompt[:-1], 0))
    b = [ctx.decode(Batch.for_sequence(prompt[-1:], len(prompt) - 1))[0].copy()]
    b += [
        ctx.decode(Batch.for_sequence([t], len(prompt) + i))[0].copy()
        for i, t in enumerate((4, 9, 1))
    ]
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)
