"""engine/init.py: the one constructor every entry point builds its engine with."""

import pytest

from engine.context import ContextParams
from engine.errors import EngineError
from engine.init import InitParams, SchedulerParams, init_from_params, init_threads
from engine.model import Model


@pytest.fixture
def closed(monkeypatch):
    """The models closed during the test, in order."""
    seen: list[Model] = []
    real = Model.close

    def close(self):
        seen.append(self)
        real(self)

    monkeypatch.setattr(Model, "close", close)
    return seen


def test_init_builds_model_context_and_an_unstarted_scheduler(tiny_llama_path):
    loaded = init_from_params(
        tiny_llama_path,
        InitParams(ContextParams(n_ctx=64, n_seq_max=2), scheduler=SchedulerParams(n_keep=3)),
    )
    try:
        assert loaded.ctx.model is loaded.model and loaded.ctx.n_seq_max == 2
        s = loaded.scheduler
        assert s is not None and s.n_slots == 2 and s.n_keep == 3 and not s.looping
    finally:
        loaded.close()


def test_init_without_scheduler_params_builds_none(tiny_llama_path):
    loaded = init_from_params(tiny_llama_path, InitParams(ContextParams(n_ctx=32)))
    try:
        assert loaded.scheduler is None and loaded.ctx.n_ctx == 32
    finally:
        loaded.close()


def test_a_failing_step_closes_the_model(tiny_llama_path, closed):
    def refuse(model):
        raise EngineError("another model")

    with pytest.raises(EngineError, match="another model"):
        init_from_params(tiny_llama_path, InitParams(ContextParams(n_ctx=32)), check=refuse)
    assert len(closed) == 1
    with pytest.raises(EngineError):  # 5 slots on a context of 1 sequence: the scheduler refuses
        init_from_params(
            tiny_llama_path, InitParams(ContextParams(n_ctx=32), scheduler=SchedulerParams(5))
        )
    assert len(closed) == 2


def test_progress_is_told_before_the_buffers_are_allocated(tiny_llama_path):
    messages = []
    loaded = init_from_params(
        tiny_llama_path,
        InitParams(ContextParams(n_ctx=32)),
        progress=lambda fraction, message: messages.append((fraction, message)),
    )
    loaded.close()
    assert messages[-1] == (1.0, "allocating the KV cache and compute buffers")


@pytest.mark.parametrize("n", [0, -2])
def test_init_threads_refuses_zero_and_negatives(n):
    with pytest.raises(EngineError, match="-t/--threads"):
        init_threads(n)


def test_init_threads_cuts_a_count_above_the_machine_and_says_why():
    said = []
    n = init_threads(100_000, warn=said.append)
    assert 1 <= n < 100_000 and said == [
        f"-t 100000 is more than the {n} hardware threads available; using {n}"
    ]
    init_threads(-1)
