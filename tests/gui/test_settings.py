"""AppSettings: QSettings round trip, corrupt keys, packaged defaults."""

from __future__ import annotations

from PySide6.QtCore import QSettings

from app.settings import AppSettings, default_settings, load_settings, save_settings


def test_settings_round_trip(tmp_path):
    qs = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    s = AppSettings(system_prompt="hi", recent_files=["/a.gguf"])
    s.add_recent("/b.gguf")
    save_settings(qs, s)
    loaded = load_settings(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    assert loaded == s and loaded.recent_files == ["/b.gguf", "/a.gguf"]


def test_settings_ignore_corrupt_values(tmp_path):
    qs = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    qs.setValue("load", "{not json")
    qs.setValue("sampling", '{"temperature": 0.1, "unknown_field": 3}')
    s = load_settings(qs)
    assert s.load == default_settings().load and s.sampling.temperature == 0.1


def test_default_settings_come_from_resources():
    s = default_settings()
    assert s.load.n_ctx == 4096 and s.server.host == "127.0.0.1" and s.preset == "Balanced"
