"""Errors reach the client by class: the caller's fault is a 400, a shutdown a 503, an engine
failure a 500 with its message, and a bug in our own code (ValueError, KeyError...) a 500
with a log line, never a 400; streams carry the same error bodies."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from engine.errors import (
    ContextOverflowError,
    EngineError,
    InvalidRequestError,
    SchedulerStoppedError,
)
from engine.server import start_server
from engine.server.errors import api_error
from engine.server.testing import FakeChatTemplate, make_fake_scheduler


@pytest.mark.parametrize(
    "error, status, type_",
    [
        (InvalidRequestError("id_slot 9 out of range"), 400, "invalid_request_error"),
        (ContextOverflowError(300, 256), 400, "exceed_context_size_error"),
        (SchedulerStoppedError("server is shutting down"), 503, "unavailable_error"),
        (EngineError("decode failed: out of memory"), 500, "server_error"),
        (ValueError("bug"), 500, "server_error"),
        (KeyError("bug"), 500, "server_error"),
    ],
)
def test_api_error_maps_by_class(error, status, type_):
    e = api_error(error)
    assert (e.status, e.type) == (status, type_)


def test_context_overflow_carries_its_numbers():
    body = api_error(ContextOverflowError(300, 256)).body()["error"]
    assert (body["n_prompt_tokens"], body["n_ctx"]) == (300, 256)


@pytest.fixture
def faulty():
    """A server whose scheduler raises whatever the test sets in `raise_on_submit`."""
    sched = make_fake_scheduler(n_slots=1)
    real_submit = sched.submit
    box: dict = {}

    def submit(request):
        if "error" in box:
            raise box["error"]
        return real_submit(request)

    sched.submit = submit  # type: ignore[method-assign]
    handle = start_server(sched, port=0, chat_template=FakeChatTemplate())
    with httpx.Client(base_url=handle.url, timeout=10) as client:
        yield client, box
    handle.stop()
    sched.stop()


@pytest.mark.parametrize(
    "error, status",
    [
        (KeyError("slot"), 500),
        (ValueError("oops"), 500),
        (InvalidRequestError("bad slot"), 400),
        (SchedulerStoppedError("stopping"), 503),
    ],
)
def test_submit_errors_become_statuses(faulty, error, status, caplog):
    client, box = faulty
    box["error"] = error
    with caplog.at_level(logging.ERROR, logger="engine.server.errors"):
        r = client.post("/completion", json={"prompt": "abc", "n_predict": 2})
    assert r.status_code == status and r.json()["error"]["code"] == status
    logged = any("internal error" in rec.getMessage() for rec in caplog.records)
    assert logged == (status == 500)  # bugs leave a traceback in the log, client errors don't
    box.clear()
    assert client.post("/completion", json={"prompt": "abc", "n_predict": 2}).status_code == 200


def test_engine_failure_mid_stream_is_an_error_event():
    sched = make_fake_scheduler(n_slots=1)
    sched.ctx.fail_on_token = 3 + ord("d")  # the fake model's second generated token
    handle = start_server(sched, port=0, chat_template=FakeChatTemplate())
    try:
        r = httpx.post(
            handle.url + "/completion",
            json={"prompt": "abc", "n_predict": 5, "stream": True},
            timeout=10,
        )
        events = [
            json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")
        ]
        assert events[0]["content"] == "d"
        assert (
            events[-1]["error"]["code"] == 500
            and "fake decode failure" in events[-1]["error"]["message"]
        )
    finally:
        handle.stop()
        sched.stop()
