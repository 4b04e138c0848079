"""Every architecture has its float64 oracle; smollm3, olmo2 (as OLMo 2 and with OLMo 3's
sliding window) and granite against theirs (tests/oracles), and checks that each one's
distinctive feature shows in the logits: smollm3's NoPE layers, olmo2's sliding layers,
granite's four multipliers."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType

import oracles.smollm3
from engine.batch import Batch
from engine.context import Context, ContextParams
from engine.errors import EngineError, UnsupportedArchError
from engine.memory import estimate_memory
from engine.model import load_model
from engine.model_info import inspect_model
from engine.models import ARCHITECTURES
from ggufgen import GRANITE_SCALES, write_tiny_model
from hostile_gguf import KV, TensorEntry, build_layout, parse_layout
from oracles import ORACLES, oracle_logits

F32 = dict(type_k="f32", type_v="f32")
TOKENS = [5, 17, 42, 9, 100, 3, 77, 250, 31, 8, 64, 200, 12, 7, 150, 99, 23, 45, 61, 2, 11, 19]
VARIANTS = {  # test id -> (architecture, write_tiny_model keywords)
    "smollm3": ("smollm3", {}),
    "olmo2": ("olmo2", {}),
    "olmo3": ("olmo2", {"sliding": True}),
    "granite": ("granite", {}),
}


def test_every_architecture_has_an_oracle():
    assert set(ARCHITECTURES) <= set(ORACLES)


def _err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _close(a, b, tol=2e-3):
    err = _err(a, b)
    assert err < tol, f"max relative error {err:.2e}"


def _differs(a, b, tol=5e-3):
    err = _err(a, b)
    assert err > tol, f"max relative difference only {err:.2e}"


@pytest.fixture(scope="module", params=list(VARIANTS))
def model(request, tiny_model_dir):
    arch, kw = VARIANTS[request.param]
    return load_model(
        write_tiny_model(tiny_model_dir / f"extra-{request.param}.gguf", arch=arch, **kw)
    )


def _prefill(model, tokens=TOKENS, n_ctx=64):
    ctx = Context(model, ContextParams(n_ctx=n_ctx, **F32))
    return ctx.decode(Batch.for_sequence(tokens, 0, logits_all=True))


def test_prefill_matches_oracle(model):
    _close(_prefill(model), oracle_logits(model.path, TOKENS, 64))


def test_decode_token_by_token_matches_oracle(model):
    ctx = Context(model, ContextParams(n_ctx=64, **F32))
    steps = np.stack([ctx.decode(Batch.for_sequence([t], i))[0] for i, t in enumerate(TOKENS)])
    _close(steps, oracle_logits(model.path, TOKENS, ctx.n_ctx_seq))


def test_two_sequences_in_one_batch_match_oracle(model):
    """A 22-token prompt (batch attention) and a 9-token one (per-token kernel) in one batch,
    then one decode token of each in the next."""
    a, b = TOKENS, TOKENS[5:14][::-1]
    ctx = Context(model, ContextParams(n_ctx=128, n_seq_max=2, **F32))
    out = ctx.decode(
        Batch.concat(
            [
                Batch.for_sequence(a, 0, seq_id=0, logits_all=True),
                Batch.for_sequence(b, 0, seq_id=1, logits_all=True),
            ]
        )
    )
    _close(out[: len(a)], oracle_logits(model.path, a, ctx.n_ctx_seq))
    _close(out[len(a) :], oracle_logits(model.path, b, ctx.n_ctx_seq))
    nxt = ctx.decode(
        Batch.concat(
            [Batch.for_sequence([60], len(a), seq_id=0), Batch.for_sequence([70], len(b), seq_id=1)]
        )
    )
    _close(nxt[0], oracle_logits(model.path, a + [60], ctx.n_ctx_seq)[-1])
    _close(nxt[1], oracle_logits(model.path, b + [70], ctx.n_ctx_seq)[-1])


def test_context_shift_rerotates_keys(model):
    """After dropping positions 4..9, layer-0 keys of the moved tokens equal keys computed fresh
    at their new positions."""
    p = ContextParams(n_ctx=64, **F32)
    ctx = Context(model, p)
    ctx.decode(Batch.for_sequence(TOKENS[:16], 0))
    ctx.kv.seq_shift_discard(0, 4, 6)
    fresh = Context(model, p)
    fresh.decode(Batch.for_sequence(TOKENS[:4] + TOKENS[10:16], 0))
    np.testing.assert_allclose(ctx.kv.k[0][0, :10], fresh.kv.k[0][0, :10], rtol=1e-4, atol=1e-4)


def test_memory_report_matches_estimate(model):
    ctx = Context(model, ContextParams(n_ctx=96, n_seq_max=3, n_ubatch=32))
    ctx.decode(Batch.for_sequence(TOKENS[:7], 0, seq_id=1))
    rep = ctx.memory_report()
    est = estimate_memory(
        model.cfg, model.weights_bytes, len(model.gguf.tensors), n_ctx=96, n_seq_max=3, n_ubatch=32
    )
    assert rep.kv_bytes == est.kv_bytes == ctx.kv.nbytes > 0
    assert rep.compute_bytes == est.compute_bytes == ctx.buf.nbytes


def test_info_names_the_architecture(model):
    info = inspect_model(model.path)
    assert info.ok, info.error
    assert info.arch == model.cfg.arch and info.n_layer == model.cfg.n_layer


# --- smollm3 ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm3(tiny_model_dir):
    return load_model(write_tiny_model(tiny_model_dir / "smollm3.gguf", arch="smollm3"))


def test_smollm3_fourth_layer_has_no_rope(smollm3, monkeypatch):
    """Layer 3 attends unrotated: rotating it too (a step past the last layer) is another model."""
    assert [smollm3.cfg.uses_rope(il) for il in range(4)] == [True, True, True, False]
    logits = _prefill(smollm3)
    monkeypatch.setattr(oracles.smollm3, "NO_ROPE_LAYER_STEP", 1 << 20)
    _differs(logits, oracle_logits(smollm3.path, TOKENS, 64))


def test_smollm3_context_shift_keeps_nope_keys(smollm3):
    """The context shift re-rotates the keys of RoPE layers only: layer 3's keys move as they are."""
    ctx = Context(smollm3, ContextParams(n_ctx=64, **F32))
    ctx.decode(Batch.for_sequence(TOKENS[:16], 0))
    nope_before, rope_before = ctx.kv.k[3][0, 10:16].copy(), ctx.kv.k[0][0, 10:16].copy()
    ctx.kv.seq_shift_discard(0, 4, 6)
    np.testing.assert_array_equal(ctx.kv.k[3][0, 4:10], nope_before)
    assert np.abs(ctx.kv.k[0][0, 4:10] - rope_before).max() > 1e-3


# --- olmo2 --------------------------------------------------------------------------------------
def test_olmo3_sliding_window_keys_matter(tiny_model_dir):
    """OLMo 3's keys (window and pattern, YaRN on the global layer only) change the model: the
    same weights without them give other logits; the pattern reads as written."""
    path = write_tiny_model(tiny_model_dir / "olmo3-keys.gguf", arch="olmo2", sliding=True)
    model = load_model(path)
    assert [model.cfg.layer_window(il) for il in range(4)] == [6, 6, 6, 0]
    logits = _prefill(model)
    _close(logits, oracle_logits(path, TOKENS, 64))
    plain = write_tiny_model(tiny_model_dir / "olmo2-same-weights.gguf", arch="olmo2")
    _differs(logits, oracle_logits(plain, TOKENS, 64))


# --- granite ------------------------------------------------------------------------------------
@pytest.mark.parametrize("left_out", list(GRANITE_SCALES))
def test_granite_each_multiplier_matters(tiny_model_dir, left_out):
    """Every multiplier is applied: the oracle of the same weights without it disagrees."""
    model = load_model(write_tiny_model(tiny_model_dir / "granite.gguf", arch="granite"))
    logits = _prefill(model)
    scales = {k: v for k, v in GRANITE_SCALES.items() if k != left_out}
    other = write_tiny_model(
        tiny_model_dir / f"granite-no-{left_out}.gguf", arch="granite", granite_scales=scales
    )
    _differs(logits, oracle_logits(other, TOKENS, 64))


def test_granite_rope_freqs_divide_the_frequencies(tiny_model_dir):
    path = write_tiny_model(
        tiny_model_dir / "granite-rope-freqs.gguf", arch="granite", rope_freqs=True
    )
    logits = _prefill(load_model(path))
    _close(logits, oracle_logits(path, TOKENS, 64))
    _differs(
        logits,
        oracle_logits(
            write_tiny_model(tiny_model_dir / "granite.gguf", arch="granite"), TOKENS, 64
        ),
    )


def test_granite_rope_finetuned_false_turns_rope_off(tiny_model_dir):
    """llama.cpp's granite takes rope.scaling.finetuned as its RoPE switch (default on)."""
    plain = write_tiny_model(tiny_model_dir / "granite.gguf", arch="granite")
    layout = parse_layout(plain.read_bytes())
    layout.kvs.append(KV("granite.rope.scaling.finetuned", GGUFValueType.BOOL, False))
    path = tiny_model_dir / "granite-no-rope.gguf"
    path.write_bytes(build_layout(layout))
    model = load_model(path)
    assert model.cfg.layer_rope(0, 64).n_rot == 0
    logits = _prefill(model)
    _close(logits, oracle_logits(path, TOKENS, 64))
    _differs(logits, oracle_logits(plain, TOKENS, 64))


def test_granite_bias_tensors_are_refused(tmp_path):
    """llama.cpp's granite takes optional biases; a file with them is refused, not run without."""
    layout = parse_layout(write_tiny_model(tmp_path / "g.gguf", arch="granite").read_bytes())
    start = -(-len(layout.data) // layout.alignment) * layout.alignment
    layout.data += bytes(start - len(layout.data) + 64 * 4)
    layout.tensors.append(TensorEntry("blk.0.ffn_down.bias", [64], GGMLQuantizationType.F32, start))
    path = tmp_path / "bias.gguf"
    path.write_bytes(build_layout(layout))
    with pytest.raises(UnsupportedArchError, match="blk.0.ffn_down.bias"):
        load_model(path)


def test_granite_bad_multipliers_are_clear_errors(tmp_path):
    path = write_tiny_model(tmp_path / "g.gguf", arch="granite")
    missing = tmp_path / "no-logit-scale.gguf"
    missing.write_bytes(path.read_bytes().replace(b"granite.logit_scale", b"granite.logit_scalX"))
    with pytest.raises(EngineError, match="granite.logit_scale"):
        load_model(missing)
    zero = write_tiny_model(
        tmp_path / "zero.gguf", arch="granite", granite_scales={"logit_scale": 0.0}
    )
    with pytest.raises(EngineError, match="logit_scale.*out of range"):
        load_model(zero)
    negative = write_tiny_model(
        tmp_path / "neg.gguf", arch="granite", granite_scales={"residual_scale": -1.0}
    )
    with pytest.raises(EngineError, match="residual_scale.*out of range"):
        load_model(negative)
