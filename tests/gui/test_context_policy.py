"""fit_to_context: the oldest turns go first, then the reply shrinks, then the app refuses."""

from __future__ import annotations

import pytest

from app.context_policy import fit_to_context
from app.errors import AppError


def _count(messages):
    return sum(len(m["content"].split()) for m in messages)


def test_fit_to_context_keeps_system_and_drops_oldest_turns():
    msgs = [{"role": "system", "content": "sys"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "w " * 10} for i in range(6)
    ]
    fitted, dropped, max_tokens = fit_to_context(_count, msgs, n_ctx=40, max_tokens=10)
    assert fitted[0]["role"] == "system" and dropped == 4 and len(fitted) == 3
    assert _count(fitted) + max_tokens <= 40


def test_fit_to_context_shortens_reply_then_refuses():
    msgs = [{"role": "user", "content": "w " * 30}]
    _, dropped, max_tokens = fit_to_context(_count, msgs, n_ctx=40, max_tokens=100)
    assert dropped == 0 and max_tokens == 10
    with pytest.raises(AppError, match="too long for the context"):
        fit_to_context(_count, [{"role": "user", "content": "w " * 50}], n_ctx=40, max_tokens=5)
