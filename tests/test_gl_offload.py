"""-ngl with the OpenGL backend: whole forward passes (prefill, then decode) on the GPU match
the CPU's logits, for every architecture whose description (models/spec.py) the backend
claims; the memory report per device; the fallbacks to the CPU (no GL, out of GPU memory, a
tensor type without a shader); --list-devices."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.backends.gl.offload import unsupported_reason
from engine.batch import Batch
from engine.context import Context, ContextParams
from engine.model import load_model
from engine.models import ARCHITECTURES
from ggufgen import write_tiny_model
from ggufgen_gptoss import write_tiny_gptoss
from ggufgen_moe import write_tiny_moe
from gl_helpers import gl_device

TOKENS = np.array([1, 5, 9, 23, 7, 11, 3, 2, 8, 13, 17, 4, 6, 10], np.int32)
# the architectures the GL plan (offload.gl_plan, derived from each DecoderSpec) runs, each
# checked against the CPU's reference block below
GL_ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")


def logits(path, ngl: int, n_prefill: int = 10, **ctx_kw) -> tuple[np.ndarray, Context]:
    """All logits of a prefill of n_prefill tokens and of the decode steps after it."""
    model = load_model(path, n_gpu_layers=ngl)
    ctx = Context(model, ContextParams(n_ctx=64, **ctx_kw))
    rows = [ctx.decode(Batch.for_sequence(TOKENS[:n_prefill], 0, 0, logits_all=True))]
    rows += [
        ctx.decode(Batch.for_sequence(TOKENS[i : i + 1], i, 0))
        for i in range(n_prefill, len(TOKENS))
    ]
    return np.concatenate(rows), ctx


def assert_close(got: np.ndarray, want: np.ndarray, tol: float = 1e-3) -> None:
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < tol, f"max |GPU - CPU| / max |CPU| = {err:.2e}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("gl-models")
    return {
        "llama": write_tiny_model(d / "llama.gguf", "llama", n_layer=3, qtype=Q.Q4_0),
        "gemma3": write_tiny_model(d / "gemma3.gguf", "gemma3", n_layer=3, qtype=Q.Q8_0),
        "gemma2": write_tiny_model(d / "gemma2.gguf", "gemma2", n_layer=3, qtype=Q.Q5_0),
        "qwen2": write_tiny_model(d / "qwen2.gguf", "qwen2", n_layer=3, qtype=Q.Q4_1),
        "qwen3": write_tiny_model(d / "qwen3.gguf", "qwen3", n_layer=3, qtype=Q.F16),
    }


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize(("ngl", "n_gpu"), [(1, 0), (3, 2), (99, 3), (-1, 3)])
def test_gl_forward_matches_cpu(tiny, arch, ngl, n_gpu):
    """llama.cpp's -ngl: the output head counts as the last layer (1: the head alone)."""
    gl_device()
    want, _ = logits(tiny[arch], 0)
    got, ctx = logits(tiny[arch], ngl)
    assert ctx.gpu is not None and len(ctx.gpu.layers) == n_gpu and ctx.gpu.gm.head
    assert_close(got, want)


def test_gl_claims_exactly_the_architectures_checked_here(tmp_path):
    """offload.unsupported_reason, from each architecture's description and config, accepts
    those of GL_ARCHS and no other (smollm3: llama's layer, but NoPE layers): an architecture
    the backend starts to claim must join GL_ARCHS, and so the forward tests here."""

    def tiny_of(arch):
        if arch in ("qwen3moe", "qwen2moe"):
            return write_tiny_moe(tmp_path / f"{arch}.gguf", arch)
        if arch == "gpt-oss":
            return write_tiny_gptoss(tmp_path / f"{arch}.gguf")
        return write_tiny_model(tmp_path / f"{arch}.gguf", arch)

    claimed = {a for a in ARCHITECTURES if not unsupported_reason(load_model(tiny_of(a)))}
    assert claimed == set(GL_ARCHS)


@pytest.mark.parametrize("arch", [a for a in GL_ARCHS if a not in ("llama", "gemma3")])
def test_gl_forward_more_archs_match_cpu(tiny, arch):
    """gemma2 (soft-caps), qwen2 (Q/K/V biases), qwen3 (Q/K norms, NEOX)."""
    gl_device()
    want, _ = logits(tiny[arch], 0)
    got, ctx = logits(tiny[arch], 99)
    assert ctx.gpu is not None and ctx.gpu.gm.head
    assert_close(got, want)


@pytest.mark.parametrize("unified", [False, True])
def test_gl_forward_f32_kv_and_two_sequences(tiny, unified):
    gl_device()
    for ngl in (0, 99):
        model = load_model(tiny["llama"], n_gpu_layers=ngl)
        ctx = Context(
            model,
            ContextParams(n_ctx=64, n_seq_max=2, type_k="f32", type_v="f32", kv_unified=unified),
        )
        b = Batch.concat(
            [Batch.for_sequence(TOKENS[:5], 0, 0), Batch.for_sequence(TOKENS[5:9], 0, 1)]
        )
        first = ctx.decode(b)
        nxt = ctx.decode(
            Batch.concat(
                [Batch.for_sequence(TOKENS[9:10], 5, 0), Batch.for_sequence(TOKENS[10:11], 4, 1)]
            )
        )
        if ngl == 0:
            want = np.concatenate([first, nxt])
        else:
            assert_close(np.concatenate([first, nxt]), want)


def test_gl_kv_state_round_trips_through_the_gpu(tiny):
    """Slot save/restore and context shift read and write the GPU's KV cache."""
    gl_device()
    _, ctx = logits(tiny["llama"], 99, n_prefill=6)
    k, v = ctx.kv.seq_state(0)
    assert k[0].shape[0] == len(TOKENS) and np.abs(k[-1].view(np.float16)).max() > 0
    ctx.kv.seq_clear(0)
    ctx.decode(Batch.for_sequence(TOKENS[::-1], 0, 0))  # other keys in the same cells
    ctx.kv.set_seq_state(0, k, v)
    k2, _ = ctx.kv.seq_state(0)
    assert all(np.array_equal(a, b) for a, b in zip(k, k2, strict=True))


def test_gl_memory_report_per_device(tiny):
    gl_device()
    _, ctx = logits(tiny["llama"], 3, n_prefill=3)  # two layers and the head
    r = ctx.memory_report()
    cpu, gpu = r.devices
    assert (cpu.device, gpu.device) == ("CPU", "GL0") and (cpu.n_layers, gpu.n_layers) == (1, 2)
    assert gpu.kv_bytes == ctx.gpu.nbytes > 0 and cpu.kv_bytes == ctx.kv.host_nbytes > 0
    assert gpu.kv_bytes == 2 * cpu.kv_bytes  # two of three layers' caches
    from engine.buffers import compute_buffer_bytes

    assert gpu.compute_bytes == compute_buffer_bytes(ctx.cfg, ctx.n_ubatch, ctx.n_ctx_seq)
    assert gpu.weights_bytes >= ctx.model.gpu.host_bytes > 0
    assert cpu.weights_bytes == ctx.model.weights_bytes - ctx.model.gpu.host_bytes
    assert (r.weights_bytes, r.kv_bytes, r.compute_bytes) == (
        cpu.weights_bytes + gpu.weights_bytes,
        cpu.kv_bytes + gpu.kv_bytes,
        cpu.compute_bytes + gpu.compute_bytes,
    )


def test_gl_unavailable_lists_reason_and_loads_on_cpu(tiny, monkeypatch, caplog):
    from engine import backends
    from engine.backends.gl import context as glc

    def fail():
        raise glc.GLUnavailableError("no EGL display (simulated)")

    monkeypatch.setattr(glc, "GLContext", lambda: fail())
    glc.reset_shared_context()
    monkeypatch.setattr(backends, "_devices", None)
    try:
        gl0 = backends.list_devices(refresh=True)[1]
        assert (gl0.name, gl0.available, gl0.reason) == ("GL0", False, "no EGL display (simulated)")
        with caplog.at_level(logging.WARNING):
            model = load_model(tiny["llama"], n_gpu_layers=99)
        assert model.gpu is None and "not available" in caplog.text
    finally:
        monkeypatch.undo()
        glc.reset_shared_context()
        backends.list_devices(refresh=True)
        from engine.backends import gl

        gl._device = None


def test_gl_out_of_memory_falls_back_to_cpu(tiny, monkeypatch, caplog):
    dev = gl_device()
    from engine.backends.gl.device import GLDevice, GLOutOfMemoryError

    real = GLDevice.alloc

    def alloc(self, nbytes, kind, data=None):
        if kind == "kv":
            raise GLOutOfMemoryError("cannot allocate (simulated): out of GPU memory")
        return real(self, nbytes, kind, data)

    want, _ = logits(tiny["llama"], 0)
    before = dict(dev.bytes)
    monkeypatch.setattr(GLDevice, "alloc", alloc)
    with caplog.at_level(logging.WARNING):
        got, ctx = logits(tiny["llama"], 99)
    assert ctx.gpu is None and "every layer on the CPU" in caplog.text
    assert_close(got, want, 1e-6)
    assert (dev.bytes["kv"], dev.bytes["compute"]) == (
        before["kv"],
        before["compute"],
    )  # nothing left behind
    monkeypatch.setattr(
        GLDevice,
        "alloc",
        lambda self, n, kind, data=None: (_ for _ in ()).throw(GLOutOfMemoryError("simulated")),
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        model = load_model(tiny["llama"], n_gpu_layers=99)
    assert model.gpu is None and "every layer runs on the CPU" in caplog.text


def test_gl_tensor_without_shader_stays_on_cpu(tiny, monkeypatch, caplog):
    gl_device()
    from engine.backends.gl import shaders

    want, _ = logits(tiny["llama"], 0)
    monkeypatch.setattr(shaders, "MATMUL_TYPES", frozenset({Q.F32}))  # Q4_0 has "no shader" now
    with caplog.at_level(logging.WARNING):
        got, ctx = logits(tiny["llama"], 99)
    assert "blk.2.attn_q.weight stays on the CPU: Q4_0 has no OpenGL shader" in caplog.text
    assert ctx.gpu is not None
    assert_close(got, want)


def test_gl_unsupported_arch_stays_on_cpu(tmp_path, caplog):
    gl_device()
    path = write_tiny_model(tmp_path / "phi3.gguf", "phi3")
    with caplog.at_level(logging.WARNING):
        model = load_model(path, n_gpu_layers=99)
    assert model.gpu is None and "architecture phi3 has no OpenGL implementation" in caplog.text


def test_gl_list_devices_cli(capsys):
    gl_device()
    from engine.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--list-devices"])
    assert e.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Available devices:" and lines[1].startswith("  GL0: ")
    assert lines[1].endswith(" MiB free)")


def test_gl_split_mode_row_is_refused(capsys):
    from engine.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "-sm", "row", "-p", "x"])
    assert "split mode 'row'" in capsys.readouterr().err
    assert (
        build_parser().parse_args(["generate", "-sm", "none", "-ngl", "5", "-p", "x"]).n_gpu_layers
        == 5
    )


@pytest.mark.model
def test_gl_smollm2_ngl_99_matches_cpu(smollm2_path):
    gl_device()
    want, _ = logits(smollm2_path, 0, n_prefill=4)
    got, _ = logits(smollm2_path, 99, n_prefill=4)
    assert_close(got, want)
    assert (got.argmax(1) == want.argmax(1)).all()


def test_gl_context_loss_is_a_clear_error_then_cpu(tiny, monkeypatch):
    from engine.backends import DeviceLostError
    from engine.backends.gl import context as glc

    gl_device()
    want, _ = logits(tiny["llama"], 0, n_prefill=3)
    model = load_model(tiny["llama"], n_gpu_layers=99)
    ctx = Context(model, ContextParams(n_ctx=64))
    ctx.decode(Batch.for_sequence(TOKENS[:2], 0, 0))

    def lost(self):
        raise glc.GLContextLostError("the OpenGL context was lost (simulated)")

    monkeypatch.setattr(glc.GLContext, "check_lost", lost)
    with pytest.raises(DeviceLostError, match="runs on the CPU .* send the request again"):
        ctx.decode(Batch.for_sequence(TOKENS[2:3], 2, 0))
    assert ctx.gpu is None and model.gpu is None and ctx.kv.seq_len(0) == 0
    got = ctx.decode(Batch.for_sequence(TOKENS[:3], 0, 0, logits_all=True))  # the prompt again
    assert_close(got, want[:3], 1e-6)


def test_gl_unified_cache_moves_runs_on_the_gpu(tiny):
    """A unified pool moves a growing sequence's cells (KVCache._move/_compact): on the GPU
    too, or its later logits would go wrong."""
    gl_device()
    rng = np.random.default_rng(3)
    toks = rng.integers(1, 200, 48).astype(np.int32)
    runs = []
    for ngl in (0, 99):
        model = load_model(tiny["gemma3"], n_gpu_layers=ngl)
        ctx = Context(model, ContextParams(n_ctx=64, n_seq_max=2, kv_unified=True))
        rows = [
            ctx.decode(Batch.for_sequence(toks[:30], 0, 0)),
            ctx.decode(Batch.for_sequence(toks[30:36], 0, 1)),
        ]
        for i in range(30, 42):  # sequence 0 outgrows its run
            rows.append(ctx.decode(Batch.for_sequence(toks[i : i + 1], i, 0)))
        runs.append(np.concatenate(rows))
    assert_close(runs[1], runs[0])


def test_gl_tensor_past_the_block_size_stays_on_cpu(tiny, monkeypatch, caplog):
    dev = gl_device()
    want, _ = logits(tiny["llama"], 0)
    real = dev.max_block_bytes
    monkeypatch.setattr(dev, "max_block_bytes", 3000)  # the FFN matrices (> 4 KiB) do not fit now
    with caplog.at_level(logging.WARNING):
        model = load_model(tiny["llama"], n_gpu_layers=99)
    assert "blk.0.ffn_up.weight stays on the CPU: its 0 MiB exceed the 0 MiB" in caplog.text
    assert model.gpu is not None and not model.gpu.head  # the output matrix is too big too
    with caplog.at_level(
        logging.WARNING
    ):  # nor does the compute scratch: the context runs on the CPU
        assert Context(model, ContextParams(n_ctx=64)).gpu is None
    assert "this context runs every layer on the CPU" in caplog.text
    monkeypatch.setattr(dev, "max_block_bytes", real)
    ctx = Context(model, ContextParams(n_ctx=64))
    rows = [ctx.decode(Batch.for_sequence(TOKENS[:10], 0, 0, logits_all=True))]
    rows += [
        ctx.decode(Batch.for_sequence(TOKENS[i : i + 1], i, 0)) for i in range(10, len(TOKENS))
    ]
    assert ctx.gpu is not None
    assert_close(np.concatenate(rows), want)


def test_gl_head_on_gpu_gives_embeddings_and_many_logit_rows(tiny):
    """Hidden states (embeddings=True) and more logit rows than the scratch holds at once."""
    gl_device()
    outs = []
    for ngl in (0, 99):
        model = load_model(tiny["gemma3"], n_gpu_layers=ngl)
        ctx = Context(model, ContextParams(n_ctx=64))
        if ngl:
            ctx.gpu.logit_rows = 3  # three rows of logits per download: 10 rows take four
        emb = ctx.decode(Batch.for_sequence(TOKENS[:10], 0, 0, logits_all=True), embeddings=True)
        ctx.kv.seq_clear(0)
        outs.append((emb, ctx.decode(Batch.for_sequence(TOKENS[:10], 0, 0, logits_all=True))))
    assert_close(outs[1][0], outs[0][0])
    assert_close(outs[1][1], outs[0][1])


def test_gl_forward_with_the_gpu_mat_mul_matches_cpu(tiny, monkeypatch):
    """The workgroup-per-row mat-mul real GPUs get (llvmpipe runs the per-row one)."""
    dev = gl_device()
    want, _ = logits(tiny["gemma3"], 0)
    monkeypatch.setattr(dev, "cooperative", True)
    got, _ = logits(tiny["gemma3"], 99)
    assert_close(got, want)


def test_gl_context_shift_re_ropes_the_gpu_cache(tiny):
    """llama.cpp's context shift (seq_rm in the middle) moves and re-rotates the GPU's keys."""
    gl_device()
    outs = []
    for ngl in (0, 99):
        model = load_model(tiny["llama"], n_gpu_layers=ngl)
        ctx = Context(model, ContextParams(n_ctx=64, type_k="f32"))
        ctx.decode(Batch.for_sequence(TOKENS[:12], 0, 0))
        ctx.kv.seq_rm(0, 2, 6)  # drop 4 positions; the later 6 move down
        outs.append(ctx.decode(Batch.for_sequence(TOKENS[12:14], 8, 0, logits_all=True)))
    assert_close(outs[1], outs[0])


def test_gl_closed_context_raises_instead_of_waiting(tiny):
    """A model outliving its GL context (reset_shared_context) closes without hanging, and a
    call on the closed context is a clear error."""
    from engine.backends import gl
    from engine.backends.gl import context as glc

    gl_device()
    model = load_model(tiny["llama"], n_gpu_layers=99)
    ctx = model.gpu.ctx
    glc.reset_shared_context()
    gl._device = None
    try:
        model.close()  # its buffers went with the context: nothing to free, no hang
        with pytest.raises(glc.GLContextLostError, match="closed"):
            ctx.call(lambda: None)
    finally:
        glc.reset_shared_context()


def test_gl_list_devices_without_gl_says_none(monkeypatch, capsys):
    from engine import backends
    from engine.params import devices_text

    gl0 = backends.DeviceInfo(
        "GL0", "OpenGL", "not available", None, None, (), False, "no EGL (simulated)"
    )
    monkeypatch.setattr(backends, "list_devices", lambda refresh=False: [gl0])
    assert devices_text() == "Available devices:\n  (none)\n"
    assert "GL0: OpenGL not available: no EGL (simulated)" in capsys.readouterr().err
