"""Four slots decoding together on the real engine (tiny model): one Context.decode per step
holding every slot's next token, and a forward pass whose projections run the multi-token
mat-vec on all four tokens at once (each weight row read once), not four single-token ones."""

from __future__ import annotations

import numpy as np
import pytest

from engine import quants
from engine.context import Context, ContextParams
from engine.model import load_model
from engine.sampling import SamplingParams
from engine.scheduler import GenerationRequest, Scheduler

N_PREDICT = 6


@pytest.fixture
def scheduler(tiny_llama_path):
    model = load_model(tiny_llama_path)
    ctx = Context(model, ContextParams(n_ctx=4 * 64, n_batch=64, n_ubatch=64, n_seq_max=4))
    return Scheduler(ctx, model.tokenizer, model=model, n_slots=4)


def _spy_decode(monkeypatch, ctx) -> list[tuple[int, list[int]]]:
    calls: list[tuple[int, list[int]]] = []
    real = ctx.decode

    def decode(batch, embeddings=False):
        calls.append((len(batch), sorted(int(q) for q in batch.seq_id)))
        return real(batch, embeddings)

    monkeypatch.setattr(ctx, "decode", decode)
    return calls


def _requests(n: int) -> list[GenerationRequest]:
    params = SamplingParams(temperature=0.8, seed=7, ignore_eos=True)
    return [
        GenerationRequest([1 + i, 20 + i, 30 + i], params, n_predict=N_PREDICT) for i in range(n)
    ]


def test_four_slots_share_one_decode_call_per_step(scheduler, monkeypatch):
    calls = _spy_decode(monkeypatch, scheduler.ctx)
    handles = [scheduler.submit(r) for r in _requests(4)]
    while not all(h.done for h in handles):
        scheduler.step()
        for h in handles:
            list(h.drain())
    # one call prefills the four prompts, then one call per step decodes the four slots' tokens
    assert calls[0] == (12, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    assert calls[1:] == [(4, [0, 1, 2, 3])] * (N_PREDICT - 1)
    assert scheduler.metrics.n_decode_total == N_PREDICT


def test_four_token_step_runs_the_multi_token_matvec(scheduler, monkeypatch):
    handles = [scheduler.submit(r) for r in _requests(4)]
    scheduler.step()  # the prompts
    seen: list[tuple[str, int]] = []
    real_multi, real_fused, real_many = (
        quants.matvec_multi,
        quants.matvec_multi_many,
        quants.matvec_many,
    )

    def multi(w, x, out, path=None):
        seen.append(("multi", x.shape[0]))
        real_multi(w, x, out, path)

    def fused(ws, x, outs, path=None):
        seen.append((f"fused x{len(ws)}", x.shape[0]))
        real_fused(ws, x, outs, path)

    def many(ws, x, outs, path=None):
        seen.append(("single", 1))
        real_many(ws, x, outs, path)

    monkeypatch.setattr(quants, "matvec_multi", multi)
    monkeypatch.setattr(quants, "matvec_multi_many", fused)
    monkeypatch.setattr(quants, "matvec_many", many)
    scheduler.step()  # one token for each of the four slots
    n_layer = scheduler.ctx.cfg.n_layer
    # per layer: q, k, v in one launch, the output projection, gate and up in one launch, down;
    # then the logits of the four rows
    layer = [("fused x3", 4), ("multi", 4), ("fused x2", 4), ("multi", 4)]
    assert seen == layer * n_layer + [("multi", 4)]
    for h in handles:
        h.cancel()
    scheduler.step()


def test_batched_step_gives_each_slot_its_own_logits(tiny_llama_path):
    """The 4-token batch's rows equal what each sequence gets decoded alone (same int8 path,
    same rounding), so batching changes no reply."""
    model = load_model(tiny_llama_path)
    from engine.batch import Batch

    def run(together: bool) -> np.ndarray:
        ctx = Context(model, ContextParams(n_ctx=4 * 32, n_batch=32, n_ubatch=32, n_seq_max=4))
        for q in range(4):
            ctx.decode(Batch.for_sequence([5 + q, 9, 11], 0, q))
        parts = [Batch.for_sequence([40 + q], 3, q) for q in range(4)]
        if together:
            return ctx.decode(Batch.concat(parts))
        return np.concatenate([ctx.decode(p) for p in parts])

    np.testing.assert_allclose(run(True), run(False), rtol=1e-5, atol=1e-5)
