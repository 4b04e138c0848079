"""--sleep-idle-seconds: the model unloads when idle and reloads on the next request."""

from __future__ import annotations

import argparse
import os
import shutil
import time
import weakref

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


def _scheduler(path) -> Scheduler:
    """A started scheduler whose model only it references (so that sleeping can free it)."""
    model = load_model(path)
    return Scheduler(
        Context(model, ContextParams(n_ctx=64, n_seq_max=2)), model.tokenizer, model=model
    ).start()


@pytest.fixture
def served(tiny_llama_path, tmp_path):
    path = tmp_path / "sleepy.gguf"  # a file of this test's own: no other test maps it
    shutil.copy(tiny_llama_path, path)
    sched = _scheduler(path)
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
    assert (
        sched.ctx is None and getattr(sched.model, "weights", None) is None
    )  # context and weights are gone
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


def _mapped(path) -> bool:
    """Whether this process maps `path` (a line of /proc/self/maps names it)."""
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(os.fspath(path)) for line in f)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_sleep_frees_the_model_and_unmaps_its_file_every_cycle(served):
    client, state, sched = served
    path = sched.model.path
    before = client.post("/completion", json=PROMPT).json()["content"]
    schema = {
        "prompt": "x",
        "n_predict": 2,
        "json_schema": {"type": "integer"},
    }  # builds the grammar vocabulary
    for cycle in range(3):  # the bug showed after the first wake: every sleep is checked
        assert client.post("/completion", json=schema).status_code == 200
        r = client.post("/completion", json=PROMPT)
        assert r.status_code == 200, r.text
        assert r.json()["content"] == before, cycle  # the reloaded model answers as the first did
        model, ctx, tok = (
            weakref.ref(sched.model),
            weakref.ref(sched.ctx),
            weakref.ref(sched.tokenizer),
        )
        assert _mapped(path)
        _wait_asleep(client)
        sched.call_soon(lambda: None).result(
            10
        )  # is_sleeping is set first: the rest has run after this
        assert not _mapped(path), f"cycle {cycle}: the GGUF is still mapped while asleep"
        assert model() is None and ctx() is None and tok() is None, (cycle, model(), ctx(), tok())
        props = client.get("/props").json()  # answered from the copy kept while asleep
        assert props["model_path"] == str(path) and props["is_sleeping"] is True
        meta = client.get("/v1/models").json()["data"][0]["meta"]
        assert meta["n_params"] > 0 and meta["n_vocab"] == sched.model.cfg.n_vocab


def test_sleep_trims_the_heap_each_time(served, monkeypatch):
    """glibc keeps freed buffers in its arenas: after the first wake the weights' copies came
    from there and went back there, so sleeping gave no memory back without malloc_trim."""
    client, state, sched = served
    calls = []
    monkeypatch.setattr(sleep, "_trim_heap", lambda: calls.append(1))
    for n in (1, 2):
        assert client.post("/completion", json=PROMPT).status_code == 200
        _wait_asleep(client)
        sched.call_soon(lambda: None).result(
            10
        )  # is_sleeping is set first: the rest has run after this
        assert len(calls) == n


def test_sleep_wake_failure_is_a_clear_error_and_retried(served):
    client, state, sched = served
    path = sched.model.path
    _wait_asleep(client)
    os.rename(path, f"{path}.moved")  # gone while asleep: the reload cannot find it
    r = client.post("/completion", json=PROMPT)
    assert r.status_code == 503, r.text
    assert "sleep" in r.json()["error"]["message"] and state.is_sleeping
    os.rename(f"{path}.moved", path)
    r = client.post("/completion", json=PROMPT)  # the next request tries again
    assert r.status_code == 200, r.text
    assert not state.is_sleeping


@pytest.mark.parametrize(
    "value,seconds", [("-1", -1), ("5", 5), ("0.5", 0.5), ("1.5", 1.5), ("2e1", 20)]
)
def test_sleep_idle_seconds_flag_accepts_whole_and_fractional_seconds(value, seconds):
    p = argparse.ArgumentParser(exit_on_error=False)
    add_server_args(p)
    assert p.parse_args(["--sleep-idle-seconds", value]).sleep_idle_seconds == seconds


@pytest.mark.parametrize(
    "value,message",
    [
        ("0", "invalid value: cannot be 0 or less than -1"),  # llama-server's own words
        ("-2", "invalid value: cannot be 0 or less than -1"),
        ("-0.5", "invalid value: cannot be 0 or less than -1"),
        ("abc", "not a number of seconds"),
        ("", "not a number of seconds"),
        ("nan", "not a number of seconds"),
        ("inf", "not a number of seconds"),
    ],
)
def test_sleep_idle_seconds_flag_refuses_bad_values(value, message):
    p = argparse.ArgumentParser(exit_on_error=False)
    add_server_args(p)
    with pytest.raises(argparse.ArgumentError) as e:
        p.parse_args(["--sleep-idle-seconds", value])
    assert message in str(e.value)


def test_sleep_after_a_fractional_idle_time(tiny_llama_path):
    sched = _scheduler(tiny_llama_path)
    state = ServerState(ServerOptions())
    state.set_ready(sched)
    controller = sleep.SleepController(state, 0.25, poll_s=0.02).start()
    try:
        t0 = time.monotonic()
        while not controller.is_sleeping and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        assert controller.is_sleeping and 0.2 <= time.monotonic() - t0 < 2
    finally:
        controller.stop()
        sched.stop()


def test_sleep_wake_keeps_the_thread_count(served):
    from engine import jit

    client, _state, _sched = served
    before = jit.num_threads()
    try:
        jit.set_num_threads(1)  # as -t 1 set it at start-up; the reload must not take every core
        _wait_asleep(client)
        assert client.post("/completion", json=PROMPT).status_code == 200
        assert jit.num_threads() == 1
    finally:
        jit.set_num_threads(before)
