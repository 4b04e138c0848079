"""RequestHandle's held wake-ups, and the scheduler's policy for them (issue 17): a consumer on
another thread is woken about once per WAKE_INTERVAL_S while tokens come faster, never later
than that, at once for a first token, an end or an error, and before a long step."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from engine.sampling import SamplingParams
from engine.scheduler import GenerationRequest
from engine.server.testing import FakeTokenizer, make_fake_scheduler
from engine.tasks import END, POLL_S, WAKE_INTERVAL_S, RequestHandle

TOK = FakeTokenizer()


def handle() -> RequestHandle:
    return RequestHandle(1, GenerationRequest([1]), lambda: None)


def test_held_items_wake_a_blocked_consumer_only_when_woken(monkeypatch):
    from engine import tasks

    monkeypatch.setattr(tasks, "POLL_S", 5.0)  # no look of its own while the test runs
    h = handle()
    got: list[tuple[float, int]] = []

    def consume():
        for item in h:
            got.append((time.perf_counter(), item))

    t = threading.Thread(target=consume)
    t.start()
    h.put(1)  # a wake-up
    time.sleep(0.02)
    h.put(2, wake=False)
    h.put(3, wake=False)
    assert h.held
    time.sleep(0.05)
    assert [i for _, i in got] == [1]  # 2 and 3 wait for a wake-up
    t_wake = time.perf_counter()
    h.wake()
    h.put(END)
    t.join(2)
    assert [i for _, i in got] == [1, 2, 3] and not h.held
    assert got[1][0] >= t_wake


def test_a_blocked_consumer_finds_held_items_within_the_poll_interval():
    h = handle()
    t0 = time.perf_counter()
    h.put(7, wake=False)
    assert next(iter(h)) == 7
    assert time.perf_counter() - t0 < POLL_S + 0.5


def test_a_consumer_that_stops_early_leaves_the_rest_in_order():
    h = handle()
    for i in range(5):
        h.put(i, wake=False)
    it = iter(h)
    assert [next(it), next(it)] == [0, 1]
    it.close()
    assert list(h.drain()) == [2, 3, 4]
    h.put(5)
    h.put(END)
    assert list(h) == [5] and h.done


def test_an_error_comes_after_the_items_before_it():
    h = handle()
    h.put(1, wake=False)
    h.put(2, wake=False)
    h.finish(RuntimeError("boom"))
    seen = []
    with pytest.raises(RuntimeError, match="boom"):
        for item in h:
            seen.append(item)
    assert seen == [1, 2] and h.done

    async def batches():
        h2 = handle()
        h2.put(1, wake=False)
        h2.put(2, wake=False)
        h2.finish(RuntimeError("late"))
        out = []
        with pytest.raises(RuntimeError, match="late"):
            async for batch in h2.abatches():
                out.append(batch)
        return out

    assert asyncio.run(batches()) == [[1, 2]]


def test_async_consumers_get_what_came_together_in_one_batch():
    async def main():
        h = handle()
        loop = asyncio.get_running_loop()
        batches: list[list[int]] = []

        async def consume():
            async for batch in h.abatches():
                batches.append(batch)

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.01)

        def produce():
            for i in range(6):
                h.put(i, wake=i % 3 == 2)  # woken after every third
            h.put(END)

        await loop.run_in_executor(None, produce)
        await asyncio.wait_for(task, 2)
        return batches

    batches = asyncio.run(main())
    assert sum(batches, []) == list(range(6))
    assert len(batches) <= 3  # never one per item


def _stream_times(delay_s: float, n: int, **kw) -> tuple[list[float], int, int]:
    """Arrival times of n greedy tokens on a consumer thread, the wake-ups of its handle and
    the decodes, with a fake decode of delay_s."""
    s = make_fake_scheduler(n_slots=2, delay_s=delay_s)
    try:
        wakes = [0]
        h = s.submit(
            GenerationRequest(TOK.encode("a"), SamplingParams(temperature=0.0), n_predict=n, **kw)
        )
        wake = h.wake

        def counted() -> None:
            wakes[0] += 1
            wake()

        h.wake = counted  # type: ignore[method-assign]
        times = [time.perf_counter() for _ in h]
        return times, wakes[0], s.ctx.n_decode
    finally:
        s.stop()


def test_fast_tokens_wake_the_consumer_about_once_per_interval_and_never_later():
    times, wakes, _ = _stream_times(0.002, 60)  # ~2 ms a token: several per interval
    assert len(times) == 60
    assert 4 <= wakes <= 60 / 3  # the first, several held batches, the end
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) < WAKE_INTERVAL_S + 0.1  # held at most about an interval (+ a slow CI step)


def test_a_request_may_ask_for_its_own_wake_interval():
    # the desktop app's chat shows tokens once a frame: its worker need not wake more often
    times, wakes, _ = _stream_times(0.002, 60, wake_interval_s=0.05)
    assert len(times) == 60
    assert 3 <= wakes <= 8  # ~150 ms of tokens: the first, two or three held batches, the end
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) < 0.05 + 0.1


def test_slow_tokens_wake_the_consumer_for_each_one():
    times, wakes, n_decode = _stream_times(WAKE_INTERVAL_S * 1.5, 8)
    assert len(times) == 8 and wakes >= 8  # (one more for the end)


def test_held_tokens_are_woken_before_a_long_prompt_step():
    s = make_fake_scheduler(n_slots=2, n_ctx=512, n_batch=256, delay_s=0.002)
    try:
        a = s.submit(
            GenerationRequest(TOK.encode("a"), SamplingParams(temperature=0.0), n_predict=400)
        )
        it = iter(a)
        next(it)
        woken_before_prompt = []
        decode = s.ctx.decode

        def watched(batch, **kw):
            if len(batch) > 2:  # b's prompt chunk: nothing of a's may be waiting for a wake-up
                woken_before_prompt.append(not a.held)
            return decode(batch, **kw)

        s.ctx.decode = watched  # type: ignore[method-assign]
        time.sleep(0.01)
        s.submit(
            GenerationRequest(TOK.encode("b" * 200), SamplingParams(temperature=0.0), n_predict=2)
        )
        time.sleep(0.05)
        a.cancel()
        assert woken_before_prompt and all(woken_before_prompt)
    finally:
        s.stop()
