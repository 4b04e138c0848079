"""Image embeddings in the text model: [text, image, text] prompts of tiny LM + mmproj pairs
against the float64 oracles (tests/oracles, tests/vision_oracle.py), through the context and
through the scheduler (its prompt cache, its image spans decoded whole)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.batch import Batch
from engine.context import Context, ContextParams
from engine.errors import EngineError
from engine.model import load_model
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler
from engine.tasks import GenerationRequest
from engine.vision import MediaSpan, load_projector
from engine.vision.mtmd import placeholder_id
from mmprojgen import write_tiny_vlm_pair
from oracles import ORACLES
from oracles.common import GGUFModel
from vision_oracle import encode as oracle_encode

F32 = dict(type_k="f32", type_v="f32")
TEXT_A = [5, 17, 42, 9, 100, 3]
TEXT_B = [77, 150, 31, 8, 64]


def _err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module", params=["gemma3", "idefics3", "mlp"])
def pair(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"vlm-{request.param}")
    lm, mm = write_tiny_vlm_pair(d, request.param, seed=2)
    model = load_model(lm)
    proj = load_projector(str(mm), model)
    yield request.param, model, proj, lm, mm
    proj.close()
    model.close()


def _tile(proj, seed: int) -> np.ndarray:
    n = proj.hparams.image_size
    return np.random.default_rng(seed).uniform(-1, 1, (n, n, 3)).astype(np.float32)


def _span(proj, tile: np.ndarray, start: int, image_id: str = "ab" * 32) -> MediaSpan:
    emb = proj._encoder(tile)
    n = emb().shape[0]
    return MediaSpan(start, n, image_id, proj.non_causal, emb)


def _oracle(lm, mm, tile, span: MediaSpan) -> np.ndarray:
    emb = oracle_encode(mm, tile)
    tokens = TEXT_A + [-5] * span.n_tokens + TEXT_B
    T = len(tokens)
    vis = np.arange(T)
    if span.non_causal:
        vis[span.start : span.end] = span.end - 1
    m = GGUFModel(lm)
    rows = {span.start + i: emb[i] for i in range(span.n_tokens)}
    return ORACLES[m.arch].forward(m, np.asarray(tokens), 64, embd=rows, vis=vis)


def test_text_image_text_logits_match_the_oracle(pair):
    kind, model, proj, lm, mm = pair
    tile = _tile(proj, 1)
    span = _span(proj, tile, len(TEXT_A))
    ctx = Context(model, ContextParams(n_ctx=64, **F32))
    ctx.decode(Batch.for_sequence(np.array(TEXT_A), 0, logits_last=False))
    n = span.n_tokens
    ph = np.array([placeholder_id(span.id, i) for i in range(n)], np.int32)
    b = Batch.for_sequence(ph, span.start, logits_last=False)
    end = np.full(n, span.end - 1, np.int32) if span.non_causal else None
    ctx.decode(Batch(b.tokens, b.pos, b.seq_id, b.logits, span.embed(), end))
    got = ctx.decode(Batch.for_sequence(np.array(TEXT_B), span.end, logits_all=True))
    want = _oracle(lm, mm, tile, span)[span.end :]
    assert _err(got, want) < 3e-3, f"{kind}: relative error {_err(got, want):.2e}"
    if kind == "gemma3":  # its image tokens see each other: causal attention gives other logits
        ctx2 = Context(model, ContextParams(n_ctx=64, **F32))
        ctx2.decode(Batch.for_sequence(np.array(TEXT_A), 0, logits_last=False))
        ctx2.decode(Batch(b.tokens, b.pos, b.seq_id, b.logits, span.embed(), None))
        causal = ctx2.decode(Batch.for_sequence(np.array(TEXT_B), span.end, logits_all=True))
        assert _err(causal, want) > 1e-3


def test_image_rows_are_not_token_rows(pair):
    """The placeholders' own token embeddings must not leak in: another image at the same
    placeholders gives other logits."""
    _, model, proj, _, _ = pair
    outs = []
    for seed in (1, 2):
        span = _span(proj, _tile(proj, seed), len(TEXT_A))
        ctx = Context(model, ContextParams(n_ctx=64, **F32))
        prompt = TEXT_A + [placeholder_id("ab" * 32, i) for i in range(span.n_tokens)] + TEXT_B
        sch = Scheduler(ctx, model.tokenizer, model=model).start()
        try:
            req = GenerationRequest(
                prompt, SamplingParams(temperature=0.0, n_probs=3), n_predict=1, media=(span,)
            )
            outs.append([s.top_logprobs for s in sch.submit(req)])
        finally:
            sch.stop()
    assert outs[0] != outs[1]


def test_scheduler_reuses_an_identical_image_from_the_prompt_cache(pair):
    kind, model, proj, lm, mm = pair
    tile = _tile(proj, 3)
    ctx = Context(model, ContextParams(n_ctx=64, **F32))
    sch = Scheduler(ctx, model.tokenizer, model=model).start()
    try:
        _reuse(sch, proj, lm, mm, tile)
    finally:
        sch.stop()


def _reuse(sch, proj, lm, mm, tile) -> None:
    span = _span(proj, tile, len(TEXT_A), "cd" * 32)
    prompt = TEXT_A + [placeholder_id(span.id, i) for i in range(span.n_tokens)] + TEXT_B
    want = _oracle(lm, mm, tile, span)[-1]
    results = []
    for tail in ([], [12]):
        req = GenerationRequest(
            prompt + tail, SamplingParams(temperature=0.0, n_probs=5), n_predict=1, media=(span,)
        )
        results.append(list(sch.submit(req))[0])
    first, second = results
    assert first.token == int(np.argmax(want))
    assert second.n_cached >= span.end  # the image came from the cache, not the encoder
    # a different image at the same place: the cache is reused only up to the image
    other = _span(proj, _tile(proj, 4), len(TEXT_A), "ef" * 32)
    prompt2 = TEXT_A + [placeholder_id(other.id, i) for i in range(other.n_tokens)] + TEXT_B
    req = GenerationRequest(prompt2, SamplingParams(temperature=0.0), n_predict=1, media=(other,))
    assert list(sch.submit(req))[0].n_cached <= len(TEXT_A)


def test_a_too_small_ubatch_for_a_non_causal_image_is_a_clear_error(tmp_path):
    lm, mm = write_tiny_vlm_pair(tmp_path, "gemma3", seed=2)
    model = load_model(lm)
    proj = load_projector(str(mm), model)
    assert proj.non_causal  # gemma3's image tokens see each other
    span = _span(proj, _tile(proj, 1), 0)
    ctx = Context(model, ContextParams(n_ctx=64, n_ubatch=8, **F32))
    n = span.n_tokens
    b = Batch.for_sequence(np.array([placeholder_id(span.id, i) for i in range(n)]), 0)
    with pytest.raises(EngineError, match="ubatch"):
        ctx.decode(
            Batch(b.tokens, b.pos, b.seq_id, b.logits, span.embed(), np.full(n, n - 1, np.int32))
        )


def test_two_slots_on_a_unified_cache_decode_images_together(pair):
    """Two requests with images at once, in parallel slots sharing one unified KV pool: each
    gets the first token its prompt alone gets."""
    import threading

    kind, model, proj, lm, mm = pair
    ctx = Context(model, ContextParams(n_ctx=128, n_seq_max=2, kv_unified=True, **F32))
    sch = Scheduler(ctx, model.tokenizer, model=model).start()
    try:
        reqs, wants = [], []
        for seed, sid in ((5, "aa"), (6, "bb")):
            tile = _tile(proj, seed)
            span = _span(proj, tile, len(TEXT_A), sid * 32)
            prompt = TEXT_A + [placeholder_id(span.id, i) for i in range(span.n_tokens)] + TEXT_B
            reqs.append(
                GenerationRequest(
                    prompt, SamplingParams(temperature=0.0), n_predict=1, media=(span,)
                )
            )
            wants.append(int(np.argmax(_oracle(lm, mm, tile, span)[-1])))
        got: list[int] = [0, 0]

        def run(i: int) -> None:
            got[i] = list(sch.submit(reqs[i]))[0].token

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert got == wants, kind
    finally:
        sch.stop()
