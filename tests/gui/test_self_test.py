"""`ggstation gui --self-test` drives the window through load, chat, server and one HTTP request."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication

from app.self_test import SelfTest


def test_self_test_passes_with_fake_engine(window, qtbot, gguf_path, capsys, monkeypatch):
    exits = []
    monkeypatch.setattr(QApplication.instance(), "exit", lambda code=0: exits.append(code))
    test = SelfTest(window, gguf_path)
    test.start()
    qtbot.waitUntil(lambda: bool(exits), timeout=10000)
    assert exits == [0] and test.exit_code == 0
    out = capsys.readouterr().out
    assert "ggstation self-test ok" in out and "http=/v1/models" in out


def test_gui_command_rejects_unknown_model(capsys):
    from engine.cli import main

    assert main(["gui", "--self-test", "-m", "no-such-model-xyz"]) == 1
    assert "no-such-model-xyz" in capsys.readouterr().err
