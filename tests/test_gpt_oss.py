"""gpt-oss (engine/models/gpt_oss.py) against its float64 oracle (tests/oracles/gpt_oss.py) on
tiny generated models (tests/ggufgen_gptoss.py): prefill, token-by-token decode, several
sequences; attention sinks, YaRN and the sliding window each change the logits, so the
oracle comparisons pin them; missing metadata and tensors are clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from engine.batch import Batch
from engine.context import Context, ContextParams
from engine.errors import GGUFError, MissingTensorError
from engine.model import load_model
from engine.models import ARCHITECTURES
from ggufgen_gptoss import write_tiny_gptoss
from oracles import oracle_logits

F32 = dict(type_k="f32", type_v="f32")
TOKENS = [5, 17, 42, 9, 100, 3, 77, 250, 31, 8, 64, 200, 12, 7, 150, 99, 23, 45, 61, 2, 11, 19]


def _err(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gpt-oss")


@pytest.fixture(scope="module", params=["q8_0", "f32"])
def tiny(request, tiny_dir):
    qtype = GGMLQuantizationType[request.param.upper()]
    return load_model(write_tiny_gptoss(tiny_dir / f"tiny-{request.param}.gguf", qtype=qtype))


def test_gpt_oss_is_registered():
    assert "gpt-oss" in ARCHITECTURES


def test_prefill_matches_oracle(tiny):
    ctx = Context(tiny, ContextParams(n_ctx=64, **F32))
    logits = ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True))
    assert _err(logits, oracle_logits(tiny.path, TOKENS, ctx.n_ctx_seq)) < 2e-3


def test_decode_token_by_token_matches_oracle(tiny):
    ctx = Context(tiny, ContextParams(n_ctx=64, **F32))
    steps = np.stack([ctx.decode(Batch.for_sequence([t], i))[0] for i, t in enumerate(TOKENS)])
    assert _err(steps, oracle_logits(tiny.path, TOKENS, ctx.n_ctx_seq)) < 2e-3


def test_two_sequences_in_one_batch_match_oracle(tiny):
    """A prompt chunk (batch attention) and a short prompt (per-token kernel) together, then
    one decode token each."""
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
    assert _err(out[: len(a)], oracle_logits(tiny.path, a, ctx.n_ctx_seq)) < 2e-3
    assert _err(out[len(a) :], oracle_logits(tiny.path, b, ctx.n_ctx_seq)) < 2e-3
    nxt = ctx.decode(
        Batch.concat(
            [Batch.for_sequence([60], len(a), seq_id=0), Batch.for_sequence([70], len(b), seq_id=1)]
        )
    )
    assert _err(nxt[0], oracle_logits(tiny.path, a + [60], ctx.n_ctx_seq)[-1]) < 2e-3
    assert _err(nxt[1], oracle_logits(tiny.path, b + [70], ctx.n_ctx_seq)[-1]) < 2e-3


def test_f16_cache_decode_matches_prefill(tiny):
    """The default float16 KV cache through the f16 decode kernel (sinks included)."""
    ctx = Context(tiny, ContextParams(n_ctx=64))
    steps = np.stack([ctx.decode(Batch.for_sequence([t], i))[0] for i, t in enumerate(TOKENS[:12])])
    assert _err(steps, oracle_logits(tiny.path, TOKENS[:12], ctx.n_ctx_seq)) < 5e-3


@pytest.mark.parametrize(
    "variant",
    [dict(sinks=False), dict(yarn=False), dict(sliding_window=1024)],
    ids=["sinks", "yarn", "swa"],
)
def test_each_feature_matters(tiny_dir, variant):
    """Without the feature (same weights) the logits move far beyond the tolerance, and the
    engine still follows the oracle: so the oracle tests above would catch a wrong one."""
    full = write_tiny_gptoss(tiny_dir / "full-f32.gguf", qtype=GGMLQuantizationType.F32)
    name = "-".join(f"{k}{v}" for k, v in variant.items())
    other = write_tiny_gptoss(tiny_dir / f"{name}.gguf", qtype=GGMLQuantizationType.F32, **variant)
    ctx = Context(load_model(other), ContextParams(n_ctx=64, **F32))
    logits = ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True))
    assert _err(logits, oracle_logits(other, TOKENS, 64)) < 2e-3
    assert _err(logits, oracle_logits(full, TOKENS, 64)) > 0.1


def test_config_reads_gpt_oss_hparams(tiny):
    cfg = tiny.cfg
    assert cfg.swa_layers == (True, False, True, False) and cfg.sliding_window == 4
    assert cfg.kq_scale == 16**-0.5 and cfg.rope_yarn is not None and cfg.rope_scale == 4.0
    assert (cfg.moe.gating, cfg.moe.act, cfg.moe.norm_weights) == (
        "softmax_weight",
        "swiglu_oai",
        False,
    )


@pytest.mark.parametrize(
    "skip,error,text",
    [
        ("attention.sliding_window", GGUFError, "gpt-oss.attention.sliding_window"),
        ("expert_feed_forward_length", GGUFError, "gpt-oss.expert_feed_forward_length"),
        ("blk.1.attn_sinks.weight", MissingTensorError, "blk.1.attn_sinks.weight"),
        ("blk.0.ffn_down_exps.bias", MissingTensorError, "blk.0.ffn_down_exps.bias"),
        ("blk.2.attn_output.bias", MissingTensorError, "blk.2.attn_output.bias"),
    ],
)
def test_missing_metadata_or_tensor_is_clear_error(tmp_path, skip, error, text):
    path = write_tiny_gptoss(tmp_path / "broken.gguf", skip=(skip,))
    with pytest.raises(error, match=text.replace(".", r"\.")):
        load_model(path)


def test_harmony_vocabulary_and_template(tiny):
    """The file's tokenizer and template as a server sees them: <|return|> and <|call|> end
    generation and <|end|> does not, and the markup the reply parser reads is rendered as
    text although the file marks it control (llama.cpp's o200k_harmony rules: llama-vocab.cpp
    makes these tokens user-defined); the template is read as harmony."""
    from engine.server.tool_calls import is_harmony_template
    from engine.tokenizer.chat_template import ChatTemplate

    tok, ids = tiny.tokenizer, tiny.tokenizer.token_to_id
    assert (
        tok.is_eog(ids["<|return|>"])
        and tok.is_eog(ids["<|call|>"])
        and not tok.is_eog(ids["<|end|>"])
    )
    for t in ("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>"):
        assert tok.token_to_piece(ids[t], special=False) == t.encode()
    assert tok.token_to_piece(ids["<|return|>"], special=False) == b""
    tmpl = ChatTemplate.from_gguf(tiny.path)
    assert is_harmony_template(tmpl.source)
    prompt = tmpl.render([{"role": "user", "content": "Hi"}])
    assert prompt.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")
    assert (
        tok.encode("<|start|>assistant", add_special=False, parse_special=True)[0]
        == ids["<|start|>"]
    )
