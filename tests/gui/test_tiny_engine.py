"""The real window on the real engine with a tiny generated llama (tests/ggufgen.py): fast, no download."""

from __future__ import annotations

import json
import urllib.request

import pytest
from PySide6.QtCore import Qt

from app.dto import LoadParams, SamplingSettings
from app.engine_adapter import EngineAdapter
from app.machine import free_port

from .conftest import send


@pytest.fixture
def tiny_window(make_window, qtbot, tiny_llama_path):
    w = make_window(EngineAdapter())
    w.picker.load_panel.set_params(LoadParams(n_ctx=256, n_seq_max=1, n_batch=64, n_ubatch=64))
    w.ctx.settings.sampling = SamplingSettings(temperature=0.8, seed=1, max_tokens=12)
    w.picker.open_path(str(tiny_llama_path))
    qtbot.waitUntil(lambda: w.picker.load_panel.info is not None, timeout=30000)
    with qtbot.waitSignal(w.ctx.llm_loaded, timeout=300_000):
        w.picker.load_panel.start_load()
    return w


def test_tiny_chat_regenerate_edit_and_persist(tiny_window, qtbot, make_window, data_dir):
    w = tiny_window
    send(w, qtbot, "hello", timeout=120_000)
    reply = w.chat.chat_model.message(1)
    assert reply.stats["n_generated"] > 0 and reply.stats["n_prompt"] > 0
    assert w.chat_pane.gauge.used == reply.stats["n_prompt"] + reply.stats["n_generated"]
    with qtbot.waitSignal(
        w.chat.busy_changed, check_params_cb=lambda b: b is False, timeout=60_000
    ):
        w.chat.regenerate()
    assert w.chat.chat_model.rowCount() == 2
    w.chat_pane.begin_edit(0)
    w.chat_pane.input.setPlainText("hello again")
    with qtbot.waitSignal(
        w.chat.busy_changed, check_params_cb=lambda b: b is False, timeout=60_000
    ):
        w.chat_pane.submit()
    assert w.chat.chat_model.message(0).content == "hello again"
    saved = [(m.role, m.content) for m in w.chat.chat_model.messages()]
    w.close()
    w2 = make_window(EngineAdapter(), data_dir)
    w2.chat.open_conversation(w2.chat.conversations.conversation_id(0))
    assert [(m.role, m.content) for m in w2.chat.chat_model.messages()] == saved


def test_tiny_stop_then_send_again(tiny_window, qtbot):
    w = tiny_window
    w.ctx.settings.sampling = SamplingSettings(temperature=0.8, seed=2, max_tokens=200)
    w.chat_pane.input.setPlainText("go on")
    with qtbot.waitSignal(
        w.chat.busy_changed, check_params_cb=lambda b: b is False, timeout=60_000
    ):
        w.chat_pane.submit()
        qtbot.keyClick(w.chat_pane.input, Qt.Key.Key_Escape)
    stats = w.chat.chat_model.message(1).stats
    assert stats["finish_reason"] in (
        "stopped",
        "stop",
        "length",
    )  # stopped, unless it raced the end
    w.ctx.settings.sampling = SamplingSettings(temperature=0.8, seed=3, max_tokens=4)
    send(w, qtbot, "still alive?", timeout=60_000)
    assert w.chat.chat_model.rowCount() == 4


def test_tiny_dashboard_and_server(tiny_window, qtbot):
    w = tiny_window
    send(w, qtbot, "count me", timeout=120_000)
    report = w.ctx.session.ctx.memory_report()
    qtbot.waitUntil(lambda: w.dashboard.figures.kv_used_bytes == report.kv_used_bytes, timeout=5000)
    fig = w.dashboard.figures
    assert (fig.weights_bytes, fig.kv_bytes, fig.compute_bytes, fig.metadata_bytes) == (
        report.weights_bytes,
        report.kv_bytes,
        report.compute_bytes,
        report.metadata_bytes,
    )
    assert w.dashboard.layer_model.rowCount() == len(w.ctx.session.llm.gguf.tensors)
    w.server_panel.port.setValue(free_port())
    with qtbot.waitSignal(w.ctx.server_started, timeout=30000):
        w.server_toggle.click()
    req = urllib.request.Request(
        w.ctx.server.url + "/v1/chat/completions",
        method="POST",
        data=json.dumps(
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    body = json.loads(urllib.request.urlopen(req, timeout=60).read())
    assert body["choices"][0]["message"]["role"] == "assistant"
    qtbot.waitUntil(
        lambda: "/v1/chat/completions" in w.server_panel.log.toPlainText(), timeout=5000
    )
    with qtbot.waitSignal(w.ctx.server_stopped, timeout=30000):
        w.server_toggle.click()
