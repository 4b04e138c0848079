"""The real window on the real engine (SmolLM2 starter model): load, chat, server, latency, numbers.

Marked `model`: it needs the starter model in the cache (pulled once by tests/conftest.py).
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from app.dto import LoadParams, SamplingSettings
from app.engine_adapter import EngineAdapter
from app.machine import free_port

from .conftest import send
from .test_latency import P95_LIMIT_MS, latency_probe, p95

pytestmark = pytest.mark.model


@pytest.fixture
def real_window(make_window, qtbot, smollm2_path):
    w = make_window(EngineAdapter())
    w.picker.load_panel.set_params(LoadParams(n_ctx=1024, n_seq_max=2))
    w.ctx.settings.sampling = SamplingSettings(temperature=0.0, seed=0, max_tokens=24)
    w.picker.open_path(str(smollm2_path))
    qtbot.waitUntil(lambda: w.picker.load_panel.info is not None, timeout=30000)
    assert w.picker.load_panel.info.error is None
    return w


def test_real_engine_end_to_end(real_window, qtbot):
    w = real_window
    with qtbot.waitSignal(w.ctx.llm_loaded, timeout=300_000):
        w.picker.load_panel.start_load()
    send(w, qtbot, "Say hello in five words.", timeout=300_000)
    reply = w.chat.chat_model.message(1)
    assert reply.content.strip() and reply.stats["n_generated"] > 0
    assert (
        reply.stats["replay"]["model_sha256"] == w.ctx.session.sha256
        and len(w.ctx.session.sha256) == 64
    )

    # dashboard numbers are the engine's report
    report = w.ctx.session.memory()
    qtbot.waitUntil(lambda: w.dashboard.figures.kv_used_bytes == report.kv_used_bytes, timeout=5000)
    assert w.dashboard.figures.kv_bytes == w.ctx.session.ctx.memory_report().kv_bytes
    assert w.dashboard.layer_model.rowCount() == len(w.ctx.session.llm.gguf.tensors)

    # the server shares the loaded model
    w.server_panel.port.setValue(free_port())
    with qtbot.waitSignal(w.ctx.server_started, timeout=30000):
        w.server_toggle.click()
    body = json.loads(urllib.request.urlopen(w.ctx.server.url + "/v1/models", timeout=30).read())
    assert body["data"]
    qtbot.waitUntil(lambda: "/v1/models" in w.server_panel.log.toPlainText(), timeout=5000)
    with qtbot.waitSignal(w.ctx.server_stopped, timeout=30000):
        w.server_toggle.click()


@pytest.mark.perf
def test_real_engine_event_loop_latency(real_window, qtbot, perf_figure):
    w = real_window
    probe = latency_probe()
    probe.start()
    with qtbot.waitSignal(w.ctx.llm_loaded, timeout=300_000):
        w.picker.load_panel.start_load()
    send(w, qtbot, "Say hello in five words.", timeout=300_000)
    probe.timer.stop()
    perf_figure("GUI event-loop p95 (SmolLM2)", p95(probe), "ms", at_most=P95_LIMIT_MS)


def test_real_engine_estimate_matches_allocation(real_window, qtbot):
    w = real_window
    engine, info = w.ctx.engine, w.picker.load_panel.info
    params = w.picker.load_panel.params()
    estimate = engine.estimate(info.path, params)
    with qtbot.waitSignal(w.ctx.llm_loaded, timeout=300_000):
        w.picker.load_panel.start_load()
    real = w.ctx.session.memory()
    assert (estimate.kv_bytes, estimate.compute_bytes, estimate.weights_bytes) == (
        real.kv_bytes,
        real.compute_bytes,
        real.weights_bytes,
    )


def test_real_engine_inspect_lists_bad_file_with_reason(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(16))
    info = EngineAdapter().inspect(str(bad))
    assert info.error
