"""The server's -n is a default, not a cap: llama-server's request n_predict overrides it
(test_completion_unified asks for 80-90 tokens from a server started with -n 64)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.server.requests import n_predict


@pytest.mark.parametrize(
    "server_n,fields,expected",
    [
        (64, (80, None, None), 80),  # the request's own limit wins, above -n too
        (64, (None, None, 10), 10),
        (64, (None, None, None), 64),  # none given: -n
        (64, (-1, None, None), 64),
        (-1, (None, None, None), -1),  # neither: unlimited
        (-1, (None, 7, 3), 7),  # first given field wins
    ],
)
def test_n_predict_server_flag_is_a_default(server_n, fields, expected):
    state = SimpleNamespace(options=SimpleNamespace(n_predict=server_n))
    assert n_predict(state, *fields) == expected
