"""Model picker: folder scan, starter pull with progress, load cancel, estimate against free RAM."""

from __future__ import annotations

from .fake_engine import FakeEngine


def test_folder_scan_is_recursive(window, qtbot, tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for p in (tmp_path / "one.gguf", tmp_path / "a" / "b" / "two.gguf"):
        p.write_bytes(b"GGUF" + bytes(8))
    window.picker.add_paths([str(tmp_path)])
    qtbot.waitUntil(lambda: window.picker.files.rowCount() == 2, timeout=3000)


def test_starter_pull_reports_progress(window, qtbot):
    panel = window.picker.starter_panel
    qtbot.waitUntil(lambda: panel.starters.rowCount() == 1, timeout=3000)
    panel.list.setCurrentIndex(panel.starters.index(0))
    with qtbot.waitSignal(panel.pulled, timeout=3000) as blocker:
        panel.pull_selected()
        assert panel.progress.isVisibleTo(panel) and not panel.pull_button.isEnabled()
    assert blocker.args[0].endswith("smollm2-135m.gguf")
    qtbot.waitUntil(panel.pull_button.isEnabled, timeout=3000)  # re-enabled once the worker ends


def test_starter_pull_cancel(make_window, qtbot):
    engine = FakeEngine()
    w = make_window(engine)
    panel = w.picker.starter_panel
    qtbot.waitUntil(lambda: panel.starters.rowCount() == 1, timeout=3000)
    panel.pull_selected()
    panel.cancel()
    qtbot.waitUntil(lambda: panel._worker is None, timeout=3000)
    assert panel.status.text() == "Download cancelled"


def test_load_cancel_keeps_nothing_loaded(make_window, qtbot, gguf_path):
    w = make_window(FakeEngine(load_time=2.0))
    w.picker.open_path(gguf_path)
    qtbot.waitUntil(lambda: w.picker.load_panel.info is not None, timeout=3000)
    panel = w.picker.load_panel
    panel.start_load()
    assert panel.cancel_button.isVisibleTo(panel)
    qtbot.waitUntil(lambda: panel.progress.value() > 0, timeout=3000)
    panel.cancel_load()
    # `cancelled` and then `finished` (which frees the panel) arrive as two queued events
    qtbot.waitUntil(
        lambda: panel.status.text() == "Loading cancelled." and panel.load_button.isEnabled(),
        timeout=5000,
    )
    assert w.ctx.session is None


def test_estimate_shown_against_free_ram(window, qtbot, gguf_path):
    window.picker.open_path(gguf_path)
    panel = window.picker.load_panel
    qtbot.waitUntil(lambda: "RAM is free" in panel.estimate_label.text(), timeout=3000)
    before = {s.label: s.value for s in panel.estimate_bar.segments}["KV cache"]
    panel.n_ctx.setValue(panel.n_ctx.value() * 2)
    qtbot.waitUntil(
        lambda: {s.label: s.value for s in panel.estimate_bar.segments}["KV cache"] == 2 * before,
        timeout=3000,
    )
    assert panel.estimate_bar.capacity > 0
