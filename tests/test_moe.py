"""Mixture of experts: the routing of engine/models/moe.py (gating, top-k ties, weights), the
MoE architectures against their float64 oracles (prefill, decode, two sequences, quantised
experts), decode reading only the chosen experts, residency of the mapped experts, `info`,
and clear errors for bad expert metadata and tensors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from engine.batch import Batch
from engine.context import Context, ContextParams
from engine.errors import GGUFError
from engine.memory import estimate_memory, resident_bytes
from engine.model import load_model
from engine.model_info import inspect_model
from engine.models import moe
from engine.quants import ExpertTensor
from ggufgen_moe import write_tiny_moe
from oracles import oracle_logits

F32 = dict(type_k="f32", type_v="f32")
TOKENS = [5, 17, 42, 9, 100, 3, 77, 250, 31, 8, 64, 200, 12, 7, 150, 99, 23, 45, 61, 2, 11, 19]


def _close(a, b, tol=2e-3):
    err = np.abs(a - b).max() / np.abs(b).max()
    assert err < tol, f"max relative error {err:.2e}"


# --- routing -----------------------------------------------------------------------------------


def _spec(gating="softmax", k=2, norm=False, scale=0.0, n=4):
    return moe.MoeSpec(
        n_expert=n,
        n_expert_used=k,
        n_ff_exp=8,
        gating=gating,
        norm_weights=norm,
        weights_scale=scale,
    )


LOGITS = np.array([[0.5, 2.0, -1.0, 1.0], [3.0, -2.0, 0.0, 2.5]], np.float32)


def test_route_softmax_keeps_the_full_softmax_weights():
    experts, w = moe.route(LOGITS, _spec("softmax"))
    p = np.exp(LOGITS - LOGITS.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert experts.tolist() == [[1, 3], [0, 3]]
    np.testing.assert_allclose(w, np.take_along_axis(p, experts, 1), rtol=1e-6)


def test_route_normalised_weights_sum_to_one_and_scale_multiplies():
    _, w = moe.route(LOGITS, _spec("softmax", norm=True))
    np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-6)
    _, w2 = moe.route(LOGITS, _spec("softmax", norm=True, scale=2.5))
    np.testing.assert_allclose(w2, 2.5 * w, rtol=1e-6)
    _, w1 = moe.route(LOGITS, _spec("softmax", norm=True, scale=1.0))  # 1 and 0: unchanged
    np.testing.assert_array_equal(w1, w)


def test_route_sigmoid_and_softmax_weight():
    experts, w = moe.route(LOGITS, _spec("sigmoid"))
    assert experts.tolist() == [[1, 3], [0, 3]]
    np.testing.assert_allclose(
        w, 1 / (1 + np.exp(-np.take_along_axis(LOGITS, experts, 1))), rtol=1e-6
    )
    # gpt-oss: softmax over the k selected logits only
    experts, w = moe.route(LOGITS, _spec("softmax_weight"))
    sel = np.take_along_axis(LOGITS, experts, 1)
    ref = np.exp(sel - sel.max(1, keepdims=True))
    np.testing.assert_allclose(w, ref / ref.sum(1, keepdims=True), rtol=1e-6)
    assert not np.allclose(w, moe.route(LOGITS, _spec("softmax"))[1])


def test_route_biases():
    """router_bias moves the logits (and so the weights); probs_bias only the choice."""
    bias = np.array([0, 0, 10, 0], np.float32)
    experts, _ = moe.route(LOGITS, _spec("sigmoid"), router_bias=bias)
    assert experts[:, 0].tolist() == [2, 2]
    experts, w = moe.route(LOGITS, _spec("sigmoid"), probs_bias=bias)
    assert experts[:, 0].tolist() == [2, 2]
    np.testing.assert_allclose(w[:, 0], 1 / (1 + np.exp(-LOGITS[:, 2])), rtol=1e-6)


# Ties come out of ggml_argsort_top_k as libstdc++'s std::sort leaves them (not stable above
# 16 values). Expected orders: a C++ program running std::sort(idx, comp x[a] > x[b]) (g++ 13).
@pytest.mark.parametrize(
    "x, expected",
    [
        ([0.0] * 8, [0, 1, 2, 3, 4, 5, 6, 7]),
        ([0.0] * 17, [8, 16, 15, 14, 13, 12, 11, 10]),
        ([0.0] * 128, [80, 95, 94, 93, 92, 91, 90, 89]),
        ([1, 0, 2, 0, 2, 1, 0, 2, 1, 2, 2, 0, 1, 0, 2, 1, 2], [16, 2, 4, 14, 7, 10, 9, 8]),
    ],
)
def test_top_k_ties_as_llama_cpp(x, expected):
    assert moe.top_k(np.array([x], np.float32), 8)[0].tolist() == expected


def test_top_k_vectorised_rows_agree_with_std_sort():
    """Rows without ties near the top take a vectorised argsort; every row must still come
    out as std::sort leaves it (tied and untied rows mixed)."""
    from engine.sampling.std_sort import std_sort

    rng = np.random.default_rng(0)
    p = rng.integers(0, 40, (96, 64)).astype(np.float32)  # ties in most rows
    p[::3] = rng.standard_normal((32, 64))
    ref = []
    for row in p:
        h = np.arange(64)
        std_sort(row, h, 0, 64)
        ref.append(h[:8])
    np.testing.assert_array_equal(moe.top_k(p, 8), np.array(ref))


# --- the architectures against their oracles ---------------------------------------------------


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-moe")


@pytest.fixture(scope="module", params=["qwen3moe", "qwen2moe"])
def tiny_moe(request, moe_dir):
    return load_model(write_tiny_moe(moe_dir / f"tiny-{request.param}.gguf", arch=request.param))


def test_moe_prefill_matches_oracle(tiny_moe):
    ctx = Context(tiny_moe, ContextParams(n_ctx=64, **F32))
    logits = ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True))
    _close(logits, oracle_logits(tiny_moe.path, TOKENS, ctx.n_ctx_seq))


def test_moe_decode_token_by_token_matches_oracle(tiny_moe):
    ctx = Context(tiny_moe, ContextParams(n_ctx=64, **F32))
    steps = np.stack([ctx.decode(Batch.for_sequence([t], i))[0] for i, t in enumerate(TOKENS)])
    _close(steps, oracle_logits(tiny_moe.path, TOKENS, ctx.n_ctx_seq))


def test_moe_two_sequences_in_one_batch_match_oracle(tiny_moe):
    a, b = TOKENS, TOKENS[5:14][::-1]
    ctx = Context(tiny_moe, ContextParams(n_ctx=128, n_seq_max=2, **F32))
    out = ctx.decode(
        Batch.concat(
            [
                Batch.for_sequence(a, 0, seq_id=0, logits_all=True),
                Batch.for_sequence(b, 0, seq_id=1, logits_all=True),
            ]
        )
    )
    _close(out[: len(a)], oracle_logits(tiny_moe.path, a, ctx.n_ctx_seq))
    _close(out[len(a) :], oracle_logits(tiny_moe.path, b, ctx.n_ctx_seq))
    nxt = ctx.decode(
        Batch.concat(
            [Batch.for_sequence([60], len(a), seq_id=0), Batch.for_sequence([70], len(b), seq_id=1)]
        )
    )
    _close(nxt[0], oracle_logits(tiny_moe.path, a + [60], ctx.n_ctx_seq)[-1])
    _close(nxt[1], oracle_logits(tiny_moe.path, b + [70], ctx.n_ctx_seq)[-1])


def test_oracle_tells_normalised_from_raw_weights(tiny_moe):
    """The oracle comparison can fail: with the weight normalisation flipped (qwen3moe
    normalises the k weights, qwen2moe does not) the logits are off by far more than 2e-3."""
    cfg, spec = tiny_moe.cfg, tiny_moe.cfg.moe
    object.__setattr__(cfg, "moe", replace(spec, norm_weights=not spec.norm_weights))
    try:
        ctx = Context(tiny_moe, ContextParams(n_ctx=64, **F32))
        logits = ctx.decode(Batch.for_sequence(TOKENS[:8], 0, logits_all=True))
    finally:
        object.__setattr__(cfg, "moe", spec)
    ref = oracle_logits(tiny_moe.path, TOKENS[:8], ctx.n_ctx_seq)
    assert np.abs(logits - ref).max() / np.abs(ref).max() > 0.05


@pytest.mark.parametrize(
    "qtype, n_embd, n_ff_exp, tol",
    [
        (T.F16, 64, 32, 2e-3),
        (T.Q4_0, 64, 32, 5e-3),
        (T.Q4_K, 256, 256, 1e-2),
    ],
    ids=lambda v: getattr(v, "name", None),
)
def test_moe_quantised_experts_match_oracle(moe_dir, qtype, n_embd, n_ff_exp, tol):
    path = write_tiny_moe(
        moe_dir / f"tiny-qwen3moe-{qtype.name}.gguf",
        n_embd=n_embd,
        n_ff_exp=n_ff_exp,
        expert_qtype=qtype,
        n_layer=1,
        seed=3,
    )
    model = load_model(path)
    assert model.weights.layers[0].ffn_up_exps.qtype == qtype
    toks = TOKENS[:12]
    ref = oracle_logits(path, toks, 64)
    ctx = Context(model, ContextParams(n_ctx=64, **F32))
    _close(ctx.decode(Batch.for_sequence(toks, 0, logits_all=True)), ref, tol)  # dequantised tiles
    ctx = Context(model, ContextParams(n_ctx=64, **F32))
    steps = np.stack([ctx.decode(Batch.for_sequence([t], i))[0] for i, t in enumerate(toks)])
    _close(steps, ref, tol)  # quantised mat-vecs


# --- only the chosen experts are read ----------------------------------------------------------


def test_decode_reads_only_the_chosen_experts(tiny_moe, monkeypatch):
    """Each expert tensor is asked for exactly the experts the router chose, and nothing reads
    the stacked rows except through those views."""
    chosen: list[set] = []
    used: dict[str, set] = {}
    route, expert = moe.route, ExpertTensor.expert

    def spy_route(*a, **kw):
        experts, weights = route(*a, **kw)
        chosen.append(set(experts.ravel().tolist()))
        return experts, weights

    def spy_expert(self, e):
        used.setdefault(self.name, set()).add(int(e))
        return expert(self, e)

    ctx = Context(tiny_moe, ContextParams(n_ctx=64, **F32))
    ctx.decode(Batch.for_sequence(TOKENS[:5], 0))
    monkeypatch.setattr(moe, "route", spy_route)
    monkeypatch.setattr(ExpertTensor, "expert", spy_expert)
    ctx.decode(Batch.for_sequence([TOKENS[5]], 5))
    k, n_expert = tiny_moe.cfg.moe.n_expert_used, tiny_moe.cfg.moe.n_expert
    assert len(chosen) == tiny_moe.cfg.n_layer
    for il, sel in enumerate(chosen):
        assert len(sel) == k < n_expert
        for kind in ("gate", "up", "down"):
            assert used[f"blk.{il}.ffn_{kind}_exps.weight"] == sel


def test_load_and_decode_leave_unused_experts_on_disk(moe_dir):
    """64 experts of 64 KiB per tensor, 2 used per token: after loading and three tokens, most
    of the mapped expert pages were never touched."""
    path = write_tiny_moe(
        moe_dir / "tiny-qwen3moe-wide.gguf",
        n_embd=128,
        n_head=4,
        n_ff_exp=256,
        n_expert=64,
        n_expert_used=2,
        expert_qtype=T.F16,
        seed=5,
    )
    if resident_bytes([]) is None:
        pytest.skip("/proc/self/pagemap is not available: resident bytes are unknown here")
    _drop_page_cache(path)
    model = load_model(path)
    ctx = Context(model, ContextParams(n_ctx=64, **F32))
    for i, t in enumerate(TOKENS[:3]):
        ctx.decode(Batch.for_sequence([t], i))
    rep = ctx.memory_report()
    assert rep.weights_resident_bytes is not None
    assert rep.weights_resident_bytes < 0.35 * rep.weights_bytes, (
        rep.weights_resident_bytes,
        rep.weights_bytes,
    )


def _drop_page_cache(path) -> None:
    """Evict the just-written file from the page cache: written pages sit in large folios
    (ext4 on Linux 6.x) that a fault maps whole (512 KiB seen), so residency would measure
    the writer's folio size; pages read back by faults come in 64 KiB fault-around windows."""
    import os

    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# --- memory, info -----------------------------------------------------------------------------


def test_moe_buffers_match_the_estimate(tiny_moe):
    ctx = Context(tiny_moe, ContextParams(n_ctx=64, n_ubatch=32, **F32))
    est = estimate_memory(
        tiny_moe.cfg,
        tiny_moe.weights_bytes,
        len(tiny_moe.gguf.tensors),
        n_ctx=64,
        n_ubatch=32,
        type_k="f32",
        type_v="f32",
    )
    assert ctx.memory_report().compute_bytes == est.compute_bytes
    m = tiny_moe.cfg.moe
    assert ctx.buf.moe_gate.shape == (32, m.n_ff_exp) and ctx.buf.router.shape == (32, m.n_expert)


def test_info_reports_experts_and_active_parameters(tiny_moe):
    info = inspect_model(tiny_moe.path)
    assert info.ok, info.error
    assert (info.n_expert, info.n_expert_used) == (8, 2)
    experts = sum(int(np.prod(t.shape)) for n, t in tiny_moe.gguf.tensors.items() if "_exps." in n)
    assert info.active_params == info.n_params - experts * 3 // 4
    assert 0 < info.active_bytes < info.weights_bytes


def test_desktop_app_shows_active_parameters(tiny_moe):
    """The app's file info carries the experts, and the load panel's line names them."""
    from app.engine_adapter import EngineAdapter

    info = EngineAdapter().inspect(tiny_moe.path)
    assert (info.n_expert, info.n_expert_used) == (8, 2) and 0 < info.active_params < info.n_params
    pytest.importorskip("PySide6")
    from app.widgets.load_panel import _experts_words

    assert _experts_words(info).endswith("active: 2 of 8 experts)")


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(keys={"expert_used_count": 9}), ["expert_used_count = 9", "expert_count = 8"]),
        (dict(keys={"expert_count": 0}), ["qwen3moe.expert_count", "missing or 0"]),
        (dict(keys={"expert_count": None}), ["qwen3moe.expert_count", "missing or 0"]),
        (dict(keys={"expert_used_count": 0}), ["qwen3moe.expert_used_count"]),
        (
            dict(omit=("blk.1.ffn_down_exps.weight",)),
            ["missing tensor", "blk.1.ffn_down_exps.weight"],
        ),
        (
            dict(keys={"expert_feed_forward_length": 16}),
            ["blk.0.ffn_gate_exps.weight", "expected the 3-D"],
        ),
        (dict(keys={"expert_count": 4}), ["blk.0.ffn_gate_inp.weight", "expected"]),
    ],
)
def test_bad_expert_metadata_and_tensors_are_clear_errors(moe_dir, kw, words):
    path = write_tiny_moe(moe_dir / "bad.gguf", n_layer=2, **kw)
    with pytest.raises(GGUFError) as e:
        load_model(path)
    for w in words:
        assert w in str(e.value)
    assert str(path) in str(e.value)


def test_run_experts_with_biases_matches_numpy():
    """Per-expert biases on gate, up and down (gpt-oss has them) and the routing weights,
    on F32 experts, against a direct numpy sum over each token's experts."""
    from types import SimpleNamespace

    rng = np.random.default_rng(7)
    X, E, F, n_tok = 6, 32, 16, 5
    mats = {
        k: rng.standard_normal((X * r, c)).astype(np.float32)
        for k, r, c in (("gate", F, E), ("up", F, E), ("down", E, F))
    }
    et = {k: ExpertTensor(k, T.F32, X, m.shape[0] // X, m.shape[1], m) for k, m in mats.items()}
    bias = {k: rng.standard_normal((X, F if k != "down" else E)).astype(np.float32) for k in mats}
    w = moe.MoeWeights(
        router=None,
        gate=et["gate"],
        up=et["up"],
        down=et["down"],
        gate_bias=bias["gate"],
        up_bias=bias["up"],
        down_bias=bias["down"],
    )
    buf = SimpleNamespace(
        moe_gate=np.zeros((n_tok, F), np.float32),
        moe_up=np.zeros((n_tok, F), np.float32),
        moe_out=np.zeros((n_tok, E), np.float32),
    )
    s = SimpleNamespace(buf=buf, tile=np.zeros(1 << 16, np.float32), path="x16")
    h = rng.standard_normal((n_tok, E)).astype(np.float32)
    experts = np.array([[0, 3], [3, 5], [1, 0], [5, 2], [3, 4]])
    weights = rng.uniform(0.1, 1.0, experts.shape).astype(np.float32)
    out = np.zeros((n_tok, E), np.float32)
    moe.run_experts(s, h, w, _spec(n=X), experts, weights, out)
    ref = np.zeros((n_tok, E))
    for t in range(n_tok):
        for e, wt in zip(experts[t], weights[t], strict=True):
            g = mats["gate"][e * F : (e + 1) * F] @ h[t] + bias["gate"][e]
            u = mats["up"][e * F : (e + 1) * F] @ h[t] + bias["up"][e]
            a = g / (1 + np.exp(-g)) * u
            ref[t] += wt * (mats["down"][e * E : (e + 1) * E] @ a + bias["down"][e])
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
