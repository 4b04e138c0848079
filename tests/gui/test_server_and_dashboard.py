"""Server toggle with a real HTTP request; dashboard figures equal the engine's report."""

from __future__ import annotations

import json
import socket
import urllib.request

from app.dto import MemoryFigures
from app.format import human_bytes
from app.machine import free_port

from .conftest import send


def test_server_toggle_serves_http_and_logs(loaded_window, qtbot):
    w = loaded_window
    w.server_panel.port.setValue(free_port())
    with qtbot.waitSignal(w.ctx.server_started, timeout=5000):
        w.server_toggle.click()
    url = w.ctx.server.url
    assert w.server_toggle.isChecked() and url in w.server_toggle.text()
    assert w.server_panel.url_rows[0][0].text() == url + "/v1/chat/completions"
    body = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=5).read())
    assert body["data"]
    qtbot.waitUntil(lambda: "GET /v1/models" in w.server_panel.log.toPlainText(), timeout=3000)
    with qtbot.waitSignal(w.ctx.server_stopped, timeout=5000):
        w.server_toggle.click()
    assert not w.server_toggle.isChecked() and w.ctx.server is None


def test_server_port_in_use_suggests_free_port(loaded_window, qtbot):
    w = loaded_window
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        w.server_panel.port.setValue(port)
        with qtbot.waitSignal(w.ctx.server_failed, timeout=3000) as blocker:
            w.server_panel.toggle_button.click()
    assert f"Port {port} is already in use" in blocker.args[0]
    assert w.server_panel.use_port_button.isVisibleTo(w.server_panel)
    w.server_panel.use_port_button.click()
    assert w.server_panel.port.value() != port
    assert not w.server_toggle.isChecked()


def test_server_needs_a_model(window, qtbot):
    with qtbot.waitSignal(window.ctx.server_failed, timeout=3000) as blocker:
        window.server_toggle.click()
    assert "Load a model first" in blocker.args[0]
    assert not window.server_toggle.isChecked()


def test_dashboard_figures_equal_engine_report(loaded_window, qtbot):
    w = loaded_window
    send(w, qtbot, "fill the cache")
    report: MemoryFigures = w.ctx.session.memory()
    qtbot.waitUntil(lambda: w.dashboard.figures.kv_used_bytes == report.kv_used_bytes, timeout=3000)
    fig = w.dashboard.figures
    assert (fig.weights_bytes, fig.kv_bytes, fig.compute_bytes) == (
        report.weights_bytes,
        report.kv_bytes,
        report.compute_bytes,
    )
    assert w.dashboard.figure_labels["KV cache"].text() == human_bytes(report.kv_bytes)
    assert w.dashboard.slot_model.rowCount() == len(report.kv_per_seq_used)
    segments = {s.label: s.value for s in w.dashboard.bar.segments}
    assert segments["KV in use"] == report.kv_used_bytes
    assert w.dashboard.timeline.series["tokens/s"].points  # tokens/s reached the timeline


def test_dashboard_layer_table_and_filter(loaded_window):
    d = loaded_window.dashboard
    rows = loaded_window.ctx.session.layers()
    assert d.layer_model.rowCount() == len(rows)
    d.layer_filter.setText("blk.2.")
    assert d.layer_proxy.rowCount() == sum(r.name.startswith("blk.2.") for r in rows)


def test_backends_panel_reports_cpu_and_opengl(window):
    labels = window.dashboard.backends.labels
    assert labels["CPU"].text() not in ("", "…")
    assert labels["OpenGL renderer"].text()  # a renderer string or "not available"


def test_load_failure_is_shown_in_plain_words(window, qtbot, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(8))
    window.ctx.engine.load = lambda *a: (_ for _ in ()).throw(MemoryError("needs 80 GiB"))
    window.picker.open_path(str(bad))
    qtbot.waitUntil(lambda: window.picker.load_panel.info is not None, timeout=3000)
    panel = window.picker.load_panel
    panel.start_load()
    qtbot.waitUntil(lambda: "Not enough memory" in panel.error.text(), timeout=15000)
    assert "needs 80 GiB" in panel.error.text() and window.ctx.session is None


def test_unusable_file_is_listed_with_reason(window, qtbot, tmp_path):
    bad = tmp_path / "notgguf.gguf"
    bad.write_bytes(b"NOPE")
    window.picker.open_path(str(bad))
    qtbot.waitUntil(lambda: window.picker.files.rowCount() == 1, timeout=3000)
    assert "not a GGUF" in window.picker.files.index(0, 7).data()
    assert not window.picker.load_panel.load_button.isEnabled()


def test_dashboard_shows_the_repacked_copies(window):
    """The weights held as interleaved copies (the default decode path's) replace their mapped
    pages in RAM: said in the weights figure's detail and drawn as their own segment, the
    mapped-but-not-resident rest shrinking by as much; nothing said of them on the float path."""
    d = window.dashboard
    d.set_figures(
        MemoryFigures(
            weights_bytes=100 << 20, weights_resident_bytes=90 << 20, total_bytes=100 << 20
        )
    )
    assert "repacked" not in d.figure_labels["Weights.detail"].text()
    d.set_figures(
        MemoryFigures(
            weights_bytes=100 << 20,
            weights_resident_bytes=3 << 20,
            repacked_bytes=95 << 20,
            total_bytes=100 << 20,
        )
    )
    assert d.figure_labels["Weights"].text() == human_bytes(100 << 20)
    assert human_bytes(95 << 20) in d.figure_labels["Weights.detail"].text()
    segments = {s.label: s.value for s in d.bar.segments}
    assert segments["Weights repacked"] == 95 << 20
    assert segments["Weights mapped, not resident"] == 2 << 20
    # the copies are resident weights on the timeline; the bar never holds more than the weights
    assert d.timeline.series["Weights resident"].points[-1][1] == 98 << 20
    d.set_figures(
        MemoryFigures(
            weights_bytes=100 << 20,
            weights_resident_bytes=8 << 20,
            repacked_bytes=97 << 20,
            total_bytes=100 << 20,
        )
    )
    segments = {s.label: s.value for s in d.bar.segments}
    assert (segments["Weights repacked"], segments["Weights resident"]) == (97 << 20, 3 << 20)
    assert segments["Weights mapped, not resident"] == 0
