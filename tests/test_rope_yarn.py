"""YaRN RoPE (engine/config.py Yarn, Rope.make) against a float64 transcription of llama.cpp's
llama_context yarn_attn_factor and ggml-cpu's rope_yarn (tests/oracles/yarn.py), and the
GGUF keys that select it."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFWriter

from engine import ops
from engine.config import Rope, Yarn, base_config
from engine.gguf_file import GGUFFile
from oracles import yarn as ref

POS = np.array([0, 1, 7, 100, 4095, 70000], np.int32)


def _apply(rope: Rope, x: np.ndarray) -> np.ndarray:
    y = x.copy()
    ops.rope(y, POS, rope.inv_freq, rope.neox, rope.attn_factor)
    return y


@pytest.mark.parametrize(
    "n_rot,base,factor,n_ctx_orig,neox",
    [
        (64, 150000.0, 32.0, 4096, True),  # gpt-oss
        (128, 1000000.0, 4.0, 32768, True),  # Qwen2.5/Qwen3 long context
        (16, 10000.0, 8.0, 64, False),  # small, NORM pairs
        (32, 10000.0, 0.5, 256, True),  # factor below 1
    ],
)
def test_yarn_rope_matches_ggml(n_rot, base, factor, n_ctx_orig, neox):
    yarn = Yarn(n_ctx_orig)
    attn = yarn.context_attn_factor(factor)
    rope = Rope.make(n_rot, base, neox, factor, (), attn, yarn)
    x = np.random.default_rng(0).standard_normal((len(POS), 3, n_rot)).astype(np.float32)
    want = ref.rope(
        x,
        POS,
        n_rot,
        neox,
        base=base,
        freq_scale=1.0 / factor,
        ext_factor=1.0,
        attn_factor=ref.context_attn_factor(1.0 / factor, 1.0),
        beta_fast=32.0,
        beta_slow=1.0,
        n_ctx_orig=n_ctx_orig,
    )
    np.testing.assert_allclose(_apply(rope, x), want, rtol=1e-5, atol=2e-5)
    plain = Rope.make(n_rot, base, neox, factor)  # linear interpolation differs
    assert np.abs(_apply(plain, x) - want).max() > 1e-2


def test_yarn_with_freq_factors_and_log_mul():
    yarn = Yarn(128, ext_factor=0.7, beta_fast=16.0, beta_slow=2.0, log_mul=0.5)
    factors = np.linspace(1.0, 3.0, 16)
    rope = Rope.make(
        32, 10000.0, True, 8.0, tuple(factors), 1.3 * yarn.context_attn_factor(8.0), yarn
    )
    x = np.random.default_rng(1).standard_normal((len(POS), 2, 32)).astype(np.float32)
    want = ref.rope(
        x,
        POS,
        32,
        True,
        base=10000.0,
        freq_scale=0.125,
        ext_factor=0.7,
        attn_factor=ref.context_attn_factor(0.125, 0.7, 1.3, 0.5),
        beta_fast=16.0,
        beta_slow=2.0,
        n_ctx_orig=128,
        freq_factors=factors,
    )
    np.testing.assert_allclose(_apply(rope, x), want, rtol=1e-5, atol=2e-5)


def _metadata_only(path, **rope_keys) -> GGUFFile:
    w = GGUFWriter(str(path), "qwen2")
    w.add_block_count(2)
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_vocab_size(300)
    w.add_rope_freq_base(1000000.0)
    if "type" in rope_keys:
        w.add_string("qwen2.rope.scaling.type", rope_keys["type"])
    if "factor" in rope_keys:
        w.add_rope_scaling_factor(rope_keys["factor"])
    if "orig" in rope_keys:
        w.add_rope_scaling_orig_ctx_len(rope_keys["orig"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFFile(path)


def test_gguf_yarn_keys_select_yarn(tmp_path):
    cfg = base_config(_metadata_only(tmp_path / "y.gguf", type="yarn", factor=4.0, orig=1024))
    assert cfg.rope_yarn == Yarn(1024) and cfg.rope_scale == 4.0
    rope = cfg.layer_rope(0, 4096)
    x = np.random.default_rng(2).standard_normal((len(POS), 4, 16)).astype(np.float32)
    want = ref.rope(
        x,
        POS,
        16,
        True,
        base=1e6,
        freq_scale=0.25,
        ext_factor=1.0,
        attn_factor=ref.context_attn_factor(0.25, 1.0),
        beta_fast=32.0,
        beta_slow=1.0,
        n_ctx_orig=1024,
    )
    np.testing.assert_allclose(_apply(rope, x), want, rtol=1e-5, atol=2e-5)


def test_gguf_yarn_defaults_and_other_types(tmp_path):
    cfg = base_config(_metadata_only(tmp_path / "a.gguf", type="yarn", factor=4.0))
    assert cfg.rope_yarn == Yarn(4096)  # original context: the training context
    cfg = base_config(_metadata_only(tmp_path / "b.gguf", factor=2.0))
    assert cfg.rope_yarn is None and cfg.rope_scale == 2.0  # no type: linear (llama.cpp)
    cfg = base_config(_metadata_only(tmp_path / "c.gguf", type="none", factor=2.0))
    assert cfg.rope_yarn is None and cfg.rope_scale == 1.0
