"""Settings and window geometry persist; keyboard shortcuts; theme; the PySide6 workaround."""

from __future__ import annotations

import sys

from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from app.dto import SamplingSettings
from app.qt_compat import affected
from app.theme import apply_theme, is_dark

from .fake_engine import FakeEngine


def test_settings_and_geometry_survive_restart(make_window, data_dir):
    w = make_window()
    w.resize(760, 730)  # within the offscreen screen (restoreGeometry clamps to it)
    size = w.size()
    w.tabs.setCurrentIndex(2)
    w.sampling.inputs["temperature"].setValue(0.33)
    w.sampling.system_prompt.setPlainText("Be brief.")
    w.close()
    w2 = make_window(FakeEngine(), data_dir)
    assert w2.size() == size
    assert w2.tabs.currentIndex() == 2
    assert abs(w2.ctx.settings.sampling.temperature - 0.33) < 1e-9
    assert w2.sampling.system_prompt.toPlainText() == "Be brief."


def test_presets_apply_and_save(window, monkeypatch):
    panel = window.sampling
    panel.preset_combo.setCurrentText("Precise")
    assert window.ctx.settings.sampling.temperature == 0.2
    monkeypatch.setattr(
        "app.widgets.sampling_panel.QInputDialog.getText", lambda *a, **k: ("Mine", True)
    )
    panel.inputs["top_k"].setValue(7)
    panel._save_preset()
    assert window.ctx.settings.user_presets["Mine"]["top_k"] == 7
    assert window.ctx.settings.presets()["Mine"] == SamplingSettings(
        **window.ctx.settings.user_presets["Mine"]
    )


def test_shortcuts_new_chat_and_search(loaded_window, qtbot):
    from .conftest import send

    w = loaded_window
    send(w, qtbot, "hello")
    qtbot.keyClick(w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert w.chat.chat_model.rowCount() == 0 and w.chat.conversation_id == 0
    w.tabs.setCurrentIndex(2)
    qtbot.keyClick(w, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert w.tabs.currentIndex() == 0


def test_ctrl_enter_sends(loaded_window, qtbot):
    w = loaded_window
    w.chat_pane.input.setPlainText("via keyboard")
    with qtbot.waitSignal(w.chat.busy_changed, check_params_cb=lambda b: b is False, timeout=5000):
        qtbot.keyClick(w.chat_pane.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert w.chat.chat_model.message(0).content == "via keyboard"


def test_theme_light_and_dark(qapp):
    apply_theme(qapp, "dark")
    assert is_dark(QApplication.palette())
    apply_theme(qapp, "light")
    assert not is_dark(QApplication.palette())
    text = QApplication.palette().color(QPalette.ColorRole.Text)
    base = QApplication.palette().color(QPalette.ColorRole.Base)
    assert abs(text.lightness() - base.lightness()) > 150  # readable contrast


def test_qt_compat_targets_only_the_broken_release():
    assert affected((6, 12, 0)) == (sys.version_info < (3, 12))
    assert not affected((6, 11, 2))
