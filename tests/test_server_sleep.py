"""--sleep-idle-seconds: the model unloads when idle and reloads on the next request."""

from __future__ import annotations

import argparse
import time

import httpx
import pytest

from engine.context import Context, ContextParams
from engine.model import load_model
from engine.scheduler import Scheduler
from engine.server import ServerOptions, ServerState, listen, sleep
from engine.server.flags import add_server_args
from engine.server.http import create_app

IDLE_S = 0.5
PROMPT = {"prompt": [5, 17, 42, 9, 100, 3], "n_predict": 3, "temperature": 0}


@pytest.fixture
def served(tiny_llama_path):
    model = load_model(tiny_llama_path)
    sched = Scheduler(Context(model, ContextParams(n_ctx=64, n_seq_max=2)), model.tokenizer, model=model).start()
    state = ServerState(ServerOptions(metrics=True))
    state.set_ready(sched)
    app = create_app(state)
    controller = sleep.install(app, state, IDLE_S)
    handle = listen(state, port=0, app=app)
    with httpx.Client(base_url=handle.url, timeout=60) as client:
        yield client, state, sched
    controller.stop()
    handle.stop()
    sched.stop()


def _wait_asleep(client, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/props").json()["is_sleeping"]:
            return
        time.sleep(0.05)
    raise AssertionError("the server did not fall asleep")


def test_sleep_unloads_and_read_only_endpoints_keep_it_asleep(served):
    client, state, sched = served
    _wait_asleep(client)
    assert sched.ctx is None and sched.model.weights is None  # context and weights are gone
    for _ in range(3):  # polling these for longer than the idle time wakes nothing
        for path in ("/health", "/props", "/models", "/v1/models", "/metrics"):
            assert client.get(path).status_code == 200, path
        assert client.get("/no-such-page").status_code == 404  # no route: wakes nothing either
        time.sleep(IDLE_S / 2)
    assert state.is_sleeping


def test_sleep_request_wakes_the_model_and_answers_as_before(served):
    client, state, sched = served
    changes: list[bool] = []
    state.sleep.on_change = changes.append  # a router's child announces these
    before = client.post("/completion", json=PROMPT).json()["content"]
    _wait_asleep(client)
    r = client.post("/completion", json=PROMPT)
    assert r.status_code == 200, r.text
    assert r.json()["content"] == before  # the reloaded weights and context are the same model
    assert client.get("/props").json()["is_sleeping"] is False
    assert sched.ctx is not None
    assert changes and changes == [True, False] * (len(changes) // 2)  # asleep, awake, ...
    _wait_asleep(client)  # and it sleeps again once idle
    assert client.post("/tokenize", json={"content": "hi"}).status_code == 200
    assert not state.is_sleeping
    _wait_asleep(client)
    client.post("/props", json={})  # a write to /props wakes it, as llama-server's (501 or not)
    assert not state.is_sleeping


def test_sleep_not_while_a_request_is_in_flight(served):
    client, state, _ = served
    state.sleep.begin_request()  # what the middleware does for a request being handled
    time.sleep(3 * IDLE_S)
    assert not state.is_sleeping
    state.sleep.end_request()
    _wait_asleep(client)


@pytest.mark.parametrize("value,ok", [("-1", True), ("5", True), ("0", False), ("-2", False)])
def test_sleep_idle_seconds_flag_values(value, ok):
    p = argparse.ArgumentParser(exit_on_error=False)
    add_server_args(p)
    if ok:
        assert p.parse_args(["--sleep-idle-seconds", value]).sleep_idle_seconds == int(value)
    else:
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            p.parse_args(["--sleep-idle-seconds", value])
