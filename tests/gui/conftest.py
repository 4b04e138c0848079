"""GUI test fixtures: offscreen Qt, a FakeEngine-backed AppContext and MainWindow."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

import app  # noqa: E402,F401  (applies the PySide6 6.12 None-refcount workaround first)

from .fake_engine import FakeEngine  # noqa: E402


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def gguf_path(tmp_path):
    """A file that passes the FakeEngine's magic check."""
    path = tmp_path / "tiny-llama.gguf"
    path.write_bytes(b"GGUF" + bytes(64))
    return str(path)


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    return str(d)


@pytest.fixture
def make_window(qtbot, data_dir, fake_engine):
    """make_window(engine=None, data_dir=None) -> MainWindow; closed (and saved) at teardown."""
    from app.main import build_context
    from app.main_window import MainWindow

    windows = []

    def make(engine=None, directory=None):
        ctx = build_context(directory or data_dir, engine or fake_engine)
        window = MainWindow(ctx)
        qtbot.addWidget(window)
        window.show()
        windows.append(window)
        return window

    yield make
    for w in windows:
        if w.isVisible():
            w.close()


@pytest.fixture
def window(make_window):
    return make_window()


@pytest.fixture
def loaded_window(window, qtbot, gguf_path):
    load(window, qtbot, gguf_path)
    return window


def load(window, qtbot, path: str) -> None:
    window.picker.open_path(path)
    qtbot.waitUntil(lambda: window.picker.load_panel.info is not None, timeout=5000)
    with qtbot.waitSignal(window.ctx.llm_loaded, timeout=5000):
        window.picker.load_panel.start_load()


def send(window, qtbot, text: str, timeout: int = 5000) -> None:
    window.chat_pane.input.setPlainText(text)
    with qtbot.waitSignal(
        window.chat.busy_changed, timeout=timeout, check_params_cb=lambda busy: busy is False
    ):
        window.chat_pane.submit()
