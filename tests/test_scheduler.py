"""Scheduler over a fake context: continuous batching, prompt cache, cancel, failures."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from engine.errors import (
    ContextOverflowError,
    EngineError,
    InvalidRequestError,
    SchedulerStoppedError,
)
from engine.sampling import SamplingParams
from engine.scheduler import EmbeddingRequest, EmbeddingResult, GenerationRequest, SlotState
from engine.server.testing import FakeTokenizer, make_fake_scheduler

TOK = FakeTokenizer()
GREEDY = SamplingParams(temperature=0.0)


def req(text: str, n_predict: int = 5, **kw) -> GenerationRequest:
    return GenerationRequest(TOK.encode(text), GREEDY, n_predict=n_predict, **kw)


def text_of(steps) -> str:
    return "".join(s.text_delta for s in steps)


@pytest.fixture
def sched():
    s = make_fake_scheduler(n_slots=4, n_ctx=256, n_batch=64)
    yield s
    s.stop()


def wait_idle(s, timeout=2.0):
    deadline = time.monotonic() + timeout
    while (s.n_busy() or s.n_pending()) and time.monotonic() < deadline:
        time.sleep(0.005)
    return not (s.n_busy() or s.n_pending())


def test_scheduler_generates_greedy_continuation(sched):
    steps = sched.submit(req("abc", 5)).result()
    assert text_of(steps) == "defgh"
    assert steps[-1].finish_reason == "length"
    assert steps[-1].n_prompt == 4 and steps[-1].n_generated == 5


def test_scheduler_eog_and_stop_string(sched):
    steps = sched.submit(req("x.", 10)).result()
    assert steps[-1].finish_reason == "stop" and text_of(steps) == ""
    steps = sched.submit(req("abc", 10, stop=["fg"])).result()
    assert text_of(steps) == "de" and steps[-1].finish_reason == "stop"
    assert steps[-1].stop_word == "fg"


def test_scheduler_batches_concurrent_requests():
    s = make_fake_scheduler(n_slots=4, delay_s=0.01)
    try:
        handles = [s.submit(req(c, 20)) for c in "abcd"]
        outs = [text_of(h.result()) for h in handles]
        assert outs == [
            "bcdefghijklmnopqrstu",
            "cdefghijklmnopqrstuv",
            "defghijklmnopqrstuvw",
            "efghijklmnopqrstuvwx",
        ]
        # 4 x (prompt + 19 decodes) would be 80 calls one by one; batching needs ~21
        assert s.ctx.n_decode < 40
        assert max(s.ctx.batch_sizes) >= 4
    finally:
        s.stop()


def test_scheduler_queues_beyond_slots_in_order():
    s = make_fake_scheduler(n_slots=2)
    try:
        handles = [s.submit(req(chr(ord("a") + i % 26), 3)) for i in range(12)]
        for i, h in enumerate(handles):
            first = ord("a") + i % 26
            want = "".join(chr(ord("a") + (first - ord("a") + k) % 26) for k in (1, 2, 3))
            assert text_of(h.result()) == want
    finally:
        s.stop()


def test_scheduler_prompt_cache_reuses_prefix(sched):
    a = sched.submit(req("hello world, this is a prompt", 3)).result()
    assert a[-1].n_cached == 0
    b = sched.submit(req("hello world, this is another", 3)).result()
    assert b[-1].n_cached == len(TOK.encode("hello world, this is a"))
    same = sched.submit(req("hello world, this is another", 3)).result()
    assert same[-1].n_cached == len(TOK.encode("hello world, this is another")) - 1
    assert text_of(same) == text_of(b)


def test_scheduler_cache_prompt_false_recomputes(sched):
    sched.submit(req("hello world", 2)).result()
    r = sched.submit(req("hello world", 2, cache_prompt=False)).result()
    assert r[-1].n_cached == 0


def test_scheduler_picks_slot_with_longest_prefix(sched):
    prompts = ["first prompt aaaa", "second prompt bbbb", "third prompt cccc"]
    for p in prompts:
        sched.submit(req(p, 1)).result()
    h = sched.submit(req("second prompt bbbb and more", 1))
    steps = h.result()
    assert steps[-1].n_cached == len(TOK.encode("second prompt bbbb"))


def test_scheduler_cancel_frees_slot():
    s = make_fake_scheduler(n_slots=1, n_ctx=4096, delay_s=0.002)
    try:
        h = s.submit(req("abc", -1))
        it = iter(h)
        next(it), next(it)
        h.cancel()
        assert wait_idle(s)
        rest = list(it)  # steps queued before the cancel took effect, then the end
        assert h.done and len(rest) < 50
        assert all(step.finish_reason is None for step in rest)  # cancelled: no final step
        assert s.slots[0].state is SlotState.IDLE
        assert text_of(s.submit(req("abc", 2)).result()) == "de"
    finally:
        s.stop()


def test_scheduler_cancel_pending_request():
    s = make_fake_scheduler(n_slots=1, n_ctx=4096, delay_s=0.002)
    try:
        busy = s.submit(req("abc", -1))
        queued = s.submit(req("xyz", 3))
        queued.cancel()
        busy.cancel()
        assert queued.result() == []
        assert wait_idle(s)
    finally:
        s.stop()


def test_scheduler_failure_fails_only_affected_request():
    s = make_fake_scheduler(n_slots=2, delay_s=0.005)
    try:
        poison = TOK.encode("#", add_special=False)[0]
        s.ctx.fail_on_token = poison
        good = s.submit(req("abc", 10))
        bad = s.submit(req("ab#", 10))
        with pytest.raises(EngineError):
            bad.result()
        assert text_of(good.result()) == "defghijklm"
    finally:
        s.stop()


def test_scheduler_prompt_too_long_reports_numbers(sched):
    with pytest.raises(ContextOverflowError) as e:
        sched.submit(GenerationRequest(TOK.encode("x" * 100), GREEDY))
    assert e.value.n_prompt == 101 and e.value.n_ctx == 64
    assert "101" in str(e.value) and "64" in str(e.value)


def test_scheduler_rejects_bad_tokens_and_empty_prompt(sched):
    with pytest.raises(InvalidRequestError, match="out of range"):
        sched.submit(GenerationRequest([1, 99999], GREEDY))
    with pytest.raises(InvalidRequestError, match="empty"):
        sched.submit(GenerationRequest([], GREEDY))


def test_scheduler_stops_at_context_end(sched):
    prompt = TOK.encode("a" * 50)
    steps = sched.submit(GenerationRequest(prompt, GREEDY, n_predict=-1)).result()
    assert steps[-1].finish_reason == "length"
    assert len(prompt) + len(steps) <= sched.n_ctx_seq + 1


def test_scheduler_long_prompt_is_chunked():
    s = make_fake_scheduler(n_slots=1, n_ctx=1024, n_batch=16)
    try:
        steps = s.submit(req("q" * 100, 2)).result()
        assert text_of(steps) == "rs"
        assert max(s.ctx.batch_sizes) <= 16
    finally:
        s.stop()


def test_scheduler_embeddings_pooled_and_normalized(sched):
    r = sched.submit(EmbeddingRequest(TOK.encode("hello"), pooling="mean")).result()
    assert len(r) == 1 and isinstance(r[0], EmbeddingResult)
    assert r[0].embedding.shape == (8,)
    assert abs(np.linalg.norm(r[0].embedding) - 1.0) < 1e-5
    none = sched.submit(EmbeddingRequest(TOK.encode("hello"), pooling="none")).result()[0]
    assert none.embedding.shape == (6, 8)


def test_scheduler_async_stream(sched):
    async def consume():
        h = sched.submit(req("abc", 4))
        return [s.text_delta async for s in h.astream()]

    assert "".join(asyncio.run(consume())) == "defg"


def test_scheduler_many_threads_share_model():
    s = make_fake_scheduler(n_slots=4, delay_s=0.001)
    results = {}

    def worker(i):
        results[i] = text_of(s.submit(req("m", 5)).result())

    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        [t.start() for t in threads]
        [t.join(10) for t in threads]
        assert results == {i: "nopqr" for i in range(16)}
    finally:
        s.stop()


def test_scheduler_stop_refuses_new_and_ends_streams():
    s = make_fake_scheduler(n_slots=1, n_ctx=4096, delay_s=0.002)
    h = s.submit(req("abc", -1))
    waiting = s.submit(req("xyz", 3))
    next(iter(h))
    s.stop(join_s=2)
    list(h)  # ends
    with pytest.raises(SchedulerStoppedError):
        waiting.result()
    with pytest.raises(SchedulerStoppedError):
        s.submit(req("abc", 1))


def test_context_shift_lets_generation_run_past_the_context(tiny_llama_path):
    """With context_shift a slot that fills its context drops half of it and goes on; without
    it the generation ends with 'length' at the context size."""
    from engine.context import Context, ContextParams
    from engine.model import load_model
    from engine.sampling import SamplingParams
    from engine.scheduler import GenerationRequest, Scheduler

    model = load_model(tiny_llama_path)
    greedy = SamplingParams(temperature=0.0, ignore_eos=True)
    prompt = model.tokenizer.encode("the world", add_special=True)
    for shift, want in ((False, 32 - len(prompt)), (True, 80)):
        ctx = Context(model, ContextParams(n_ctx=32, n_seq_max=1))
        sched = Scheduler(ctx, model.tokenizer, model=model, context_shift=shift).start()
        try:
            steps = list(sched.submit(GenerationRequest(prompt, greedy, n_predict=80)))
        finally:
            sched.stop()
        assert steps[-1].finish_reason == "length"
        assert steps[-1].n_generated == want
        assert ctx.kv.seq_len(0) <= 32
