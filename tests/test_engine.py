"""The forward pass of every architecture against its float64 oracle (tests/oracles, which
read the GGUF with gguf-py only), batch/KV semantics, memory, errors."""

from __future__ import annotations

import numpy as np
import pytest

from engine.batch import Batch
from engine.context import Context, ContextParams
from engine.errors import ContextOverflowError, EngineError, UnsupportedArchError
from engine.memory import estimate_memory
from engine.model import load_model
from oracles import oracle_logits
from sweeps import sweep

F32 = dict(type_k="f32", type_v="f32")


def _close(a, b, tol=2e-3):
    err = np.abs(a - b).max() / np.abs(b).max()
    assert err < tol, f"max relative error {err:.2e}"


TOKENS = [5, 17, 42, 9, 100, 3, 77, 250, 31, 8, 64, 200, 12, 7, 150, 99, 23, 45, 61, 2, 11, 19]


@pytest.fixture(scope="module")
def tiny(tiny_arch_path):
    return load_model(tiny_arch_path)


def test_prefill_matches_oracle(tiny):
    ctx = Context(tiny, ContextParams(n_ctx=64, **F32))
    logits = ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True))
    _close(logits, oracle_logits(tiny.path, TOKENS, ctx.n_ctx_seq))


def test_decode_token_by_token_matches_oracle(tiny):
    ctx = Context(tiny, ContextParams(n_ctx=64, **F32))
    steps = np.stack([ctx.decode(Batch.for_sequence([t], i))[0] for i, t in enumerate(TOKENS)])
    _close(steps, oracle_logits(tiny.path, TOKENS, ctx.n_ctx_seq))


@pytest.mark.int8
def test_int8_decode_matches_oracle(tiny):
    """Decode on the int8 path (8-bit activations, as llama.cpp) stays within the activations'
    quantisation error of the float64 oracle (the float path: 2e-3; measured 4.5e-3 here); the
    prompt of 22 tokens runs the batch path, the 8-token ubatches the int8 mat-vecs."""
    ctx = Context(tiny, ContextParams(n_ctx=64, decode_path="int8", **F32))
    steps = np.stack([ctx.decode(Batch.for_sequence([t], i))[0] for i, t in enumerate(TOKENS)])
    ref = oracle_logits(tiny.path, TOKENS, ctx.n_ctx_seq)
    _close(steps, ref, 2e-2)
    ctx = Context(tiny, ContextParams(n_ctx=64, n_ubatch=8, decode_path="int8", **F32))
    _close(ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True)), ref, 2e-2)


def test_two_sequences_in_one_batch_match_oracle(tiny):
    """A 22-token prompt (batch attention) and a 9-token one (per-token kernel) in one batch,
    then one decode token of each in the next."""
    a, b = TOKENS, TOKENS[5:14][::-1]
    ctx = Context(tiny, ContextParams(n_ctx=128, n_seq_max=2, **F32))
    out = ctx.decode(
        Batch.concat(
            [
                Batch.for_sequence(a, 0, seq_id=0, logits_all=True),
                Batch.for_sequence(b, 0, seq_id=1, logits_all=True),
            ]
        )
    )
    _close(out[: len(a)], oracle_logits(tiny.path, a, ctx.n_ctx_seq))
    _close(out[len(a) :], oracle_logits(tiny.path, b, ctx.n_ctx_seq))
    nxt = ctx.decode(
        Batch.concat(
            [Batch.for_sequence([60], len(a), seq_id=0), Batch.for_sequence([70], len(b), seq_id=1)]
        )
    )
    _close(nxt[0], oracle_logits(tiny.path, a + [60], ctx.n_ctx_seq)[-1])
    _close(nxt[1], oracle_logits(tiny.path, b + [70], ctx.n_ctx_seq)[-1])


def test_decode_token_by_token_matches_prefill(tiny):
    ctx = Context(tiny, ContextParams(n_ctx=64))
    full = ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True))
    ctx.kv.clear()
    steps = np.stack([ctx.decode(Batch.for_sequence([t], i))[0] for i, t in enumerate(TOKENS)])
    _close(steps, full, 5e-3)


def test_small_ubatches_match_one_pass(tiny):
    one = Context(tiny, ContextParams(n_ctx=64)).decode(
        Batch.for_sequence(TOKENS, 0, logits_all=True)
    )
    ctx = Context(tiny, ContextParams(n_ctx=64, n_ubatch=5))
    _close(ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True)), one, 5e-3)


def test_mixed_batch_matches_separate_sequences(tiny):
    ctx = Context(tiny, ContextParams(n_ctx=128, n_seq_max=2))
    ctx.decode(Batch.for_sequence(TOKENS[:10], 0, seq_id=0))
    # one batch: a decode token of seq 0 and a 20-token prompt chunk of seq 1
    mixed = Batch.concat(
        [
            Batch.for_sequence([TOKENS[10]], 10, seq_id=0),
            Batch.for_sequence(TOKENS[:20], 0, seq_id=1),
        ]
    )
    out = ctx.decode(mixed)
    ref = Context(tiny, ContextParams(n_ctx=64)).decode(
        Batch.for_sequence(TOKENS[:20], 0, logits_all=True)
    )
    _close(out[0], ref[10], 5e-3)
    _close(out[1], ref[19], 5e-3)


def test_seq_cp_reuses_prefix(tiny):
    ctx = Context(tiny, ContextParams(n_ctx=128, n_seq_max=2))
    ref = ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True))
    ctx.kv.seq_cp(0, 1, 0, 12)
    assert ctx.kv.seq_len(1) == 12
    out = ctx.decode(Batch.for_sequence(TOKENS[12:], 12, seq_id=1, logits_all=True))
    _close(out, ref[12:], 5e-3)


def test_seq_rm_then_redecode(tiny):
    ctx = Context(tiny, ContextParams(n_ctx=64))
    ref = ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True))
    ctx.kv.seq_rm(0, 15)
    assert ctx.kv.seq_len(0) == 15
    _close(ctx.decode(Batch.for_sequence(TOKENS[15:], 15, logits_all=True)), ref[15:], 5e-3)


def test_context_shift_rerotates_keys(tiny):
    """After dropping positions 4..9, layer-0 keys of the moved tokens equal keys computed
    fresh at their new positions (deeper layers legitimately remember the dropped tokens)."""
    p = ContextParams(n_ctx=64, type_k="f32", type_v="f32")
    ctx = Context(tiny, p)
    ctx.decode(Batch.for_sequence(TOKENS[:16], 0))
    v_before = ctx.kv.v[1][0, 10:16].copy()
    ctx.kv.seq_shift_discard(0, 4, 6)  # keep 0..3, drop 4..9, move 10..15 to 4..9
    assert ctx.kv.seq_len(0) == 10
    fresh = Context(tiny, p)
    fresh.decode(Batch.for_sequence(TOKENS[:4] + TOKENS[10:16], 0))
    np.testing.assert_allclose(ctx.kv.k[0][0, :10], fresh.kv.k[0][0, :10], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(ctx.kv.v[1][0, 4:10], v_before)
    ctx.decode(Batch.for_sequence([TOKENS[16]], 10))  # and decoding continues at position 10
    assert ctx.kv.seq_len(0) == 11


def test_memory_report_matches_estimate(tiny):
    p = ContextParams(n_ctx=96, n_seq_max=3, n_ubatch=32)
    ctx = Context(tiny, p)
    ctx.decode(Batch.for_sequence(TOKENS[:7], 0, seq_id=1))
    rep = ctx.memory_report()
    est = estimate_memory(
        tiny.cfg, tiny.weights_bytes, len(tiny.gguf.tensors), n_ctx=96, n_seq_max=3, n_ubatch=32
    )
    assert rep.kv_bytes == est.kv_bytes == ctx.kv.nbytes > 0
    assert rep.compute_bytes == est.compute_bytes == ctx.buf.nbytes
    assert rep.kv_per_seq_used[1] == 7 * ctx.kv.bytes_per_pos and rep.kv_per_seq_used[0] == 0
    assert rep.weights_bytes == tiny.gguf.tensor_data_bytes
    f32 = estimate_memory(tiny.cfg, 0, 0, n_ctx=96, n_seq_max=3, type_k="f32", type_v="f32")
    assert f32.kv_bytes == 2 * est.kv_bytes


def test_bad_batches_are_clear_errors(tiny):
    ctx = Context(tiny, ContextParams(n_ctx=32, n_seq_max=2))
    with pytest.raises(EngineError, match="token id"):
        ctx.decode(Batch.for_sequence([tiny.cfg.n_vocab], 0))
    with pytest.raises(EngineError, match="positions must continue"):
        ctx.decode(Batch.for_sequence([1, 2], 3))
    with pytest.raises(EngineError, match="sequence id"):
        ctx.decode(Batch.for_sequence([1], 0, seq_id=2))
    with pytest.raises(ContextOverflowError, match="exceed"):
        ctx.decode(Batch.for_sequence(list(range(5, 25)), 0))
    with pytest.raises(EngineError, match="empty"):
        ctx.decode(Batch.concat([]))
    with pytest.raises(EngineError, match="cache type"):
        Context(tiny, ContextParams(n_ctx=32, type_k="q4_0"))


def test_unknown_architecture_is_clear_error(tmp_path):
    from ggufgen import write_tiny_model

    path = write_tiny_model(tmp_path / "x.gguf", arch="llama")
    data = path.read_bytes().replace(b"llama", b"zzzzz")
    bad = tmp_path / "bad-arch.gguf"
    bad.write_bytes(data)
    with pytest.raises(UnsupportedArchError, match="zzzzz"):
        load_model(bad)


def test_unified_cache_lets_each_sequence_use_the_whole_context(tiny):
    split = Context(tiny, ContextParams(n_ctx=64, n_seq_max=4))
    unified = Context(tiny, ContextParams(n_ctx=64, n_seq_max=4, kv_unified=True))
    assert split.n_ctx_seq == 16 and unified.n_ctx_seq == 64
    unified.decode(Batch.for_sequence(list(range(3, 43)), 0, seq_id=3))  # 40 > 16 positions
    est = estimate_memory(tiny.cfg, 0, 0, n_ctx=64, n_seq_max=4, kv_unified=True)
    assert est.kv_bytes == unified.kv.nbytes == split.kv.nbytes  # one shared pool of n_ctx cells


@pytest.fixture(scope="module")
def tiny_phi3(tiny_model_dir):
    from ggufgen import write_tiny_model

    return load_model(write_tiny_model(tiny_model_dir / "phi3-longrope.gguf", arch="phi3"))


@pytest.mark.parametrize("n_ctx", [32, 64])
def test_phi3_rope_factors_follow_context_size(tiny_phi3, n_ctx):
    """LongRoPE: the short factors while a sequence's context stays within the original 32
    positions, the long ones beyond it (the other regime's oracle must not match)."""
    from ggufgen import PHI3_ORIG_CTX

    ctx = Context(tiny_phi3, ContextParams(n_ctx=n_ctx, **F32))
    assert (ctx.n_ctx_seq > PHI3_ORIG_CTX) == (n_ctx == 64)
    logits = ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True))
    _close(logits, oracle_logits(tiny_phi3.path, TOKENS, n_ctx))
    other = oracle_logits(tiny_phi3.path, TOKENS, 96 - n_ctx)
    assert np.abs(logits - other).max() / np.abs(other).max() > 5e-3


def test_llama3_rope_freqs_divide_the_frequencies(tiny_model_dir):
    """Llama 3.1+ files carry rope_freqs.weight; without it the slow pairs turn 8x too fast."""
    from ggufgen import write_tiny_model

    path = write_tiny_model(tiny_model_dir / "llama-rope-freqs.gguf", arch="llama", rope_freqs=True)
    model = load_model(path)
    ctx = Context(model, ContextParams(n_ctx=64, **F32))
    logits = ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True))
    _close(logits, oracle_logits(path, TOKENS, 64))
    plain_path = write_tiny_model(tiny_model_dir / "llama-plain.gguf", arch="llama")  # same weights
    plain = oracle_logits(plain_path, TOKENS, 64)
    assert np.abs(logits - plain).max() / np.abs(plain).max() > 5e-3


def test_supported_architectures_are_listed_in_the_error(tmp_path):
    from ggufgen import write_tiny_model

    path = write_tiny_model(tmp_path / "x.gguf", arch="phi3")
    bad = tmp_path / "phi4mm.gguf"
    bad.write_bytes(path.read_bytes().replace(b"phi3", b"phiz"))
    with pytest.raises(
        UnsupportedArchError,
        match="'phiz'.*gemma2.*gemma3.*granite.*llama.*olmo2.*phi3.*qwen2.*qwen2moe.*qwen3.*qwen3moe.*smollm3",
    ):
        load_model(bad)


@pytest.mark.parametrize("qtype", sweep(["IQ4_NL", "IQ4_XS", "MXFP4"], fast={"IQ4_NL", "MXFP4"}))
def test_table_quant_weights_match_oracle(qtype, tiny_model_dir):
    """A llama whose every matrix (embeddings too) is one of the non-linear 4-bit types, read
    through the lookup kernels, against the oracle reading the same file with gguf-py.
    n_embd and n_ff are multiples of 256: IQ4_XS rows are whole 256-weight super-blocks."""
    from gguf import GGMLQuantizationType

    from ggufgen import write_tiny_model

    path = write_tiny_model(
        tiny_model_dir / f"llama-{qtype}.gguf",
        arch="llama",
        n_embd=256,
        n_ff=512,
        qtype=GGMLQuantizationType[qtype],
    )
    model = load_model(path)
    assert model.gguf.tensors["blk.0.ffn_down.weight"].qtype.name == qtype
    ctx = Context(model, ContextParams(n_ctx=64, **F32))
    want = oracle_logits(path, TOKENS, ctx.n_ctx_seq)
    _close(ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True)), want)
    ctx = Context(model, ContextParams(n_ctx=64, **F32))
    steps = np.stack([ctx.decode(Batch.for_sequence([t], i))[0] for i, t in enumerate(TOKENS)])
    _close(steps, want)
