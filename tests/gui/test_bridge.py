"""Qt-free pieces of app/: context fitting, plain error words, formatting, settings round trip."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QSettings

from app.bridge import AppError, MemoryFigures, fit_to_context, layer_of, plain_error
from app.format import human_bytes, reply_summary
from app.settings import AppSettings, default_settings, load_settings, save_settings


def _count(messages):
    return sum(len(m["content"].split()) for m in messages)


def test_fit_to_context_keeps_system_and_drops_oldest_turns():
    msgs = [{"role": "system", "content": "sys"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "w " * 10} for i in range(6)]
    fitted, dropped, max_tokens = fit_to_context(_count, msgs, n_ctx=40, max_tokens=10)
    assert fitted[0]["role"] == "system" and dropped == 4 and len(fitted) == 3
    assert _count(fitted) + max_tokens <= 40


def test_fit_to_context_shortens_reply_then_refuses():
    msgs = [{"role": "user", "content": "w " * 30}]
    _, dropped, max_tokens = fit_to_context(_count, msgs, n_ctx=40, max_tokens=100)
    assert dropped == 0 and max_tokens == 10
    with pytest.raises(AppError, match="too long for the context"):
        fit_to_context(_count, [{"role": "user", "content": "w " * 50}], n_ctx=40, max_tokens=5)


def test_plain_error_names_the_problem_and_keeps_engine_message():
    class UnsupportedQuantError(Exception):
        pass

    text = plain_error(UnsupportedQuantError("tensor blk.0.attn_q uses IQ2_XS"))
    assert text.startswith("This model uses a quantisation type") and "IQ2_XS" in text
    assert plain_error(MemoryError("x")).startswith("Not enough memory")


def test_memory_figures_from_engine_report_dict():
    fig = MemoryFigures.from_report({"weights_bytes": 10, "weights_resident_bytes": None,
                                     "kv_bytes": 4, "kv_per_seq_used": [1, 2], "estimate": True})
    assert fig.weights_resident_bytes == 0 and fig.kv_per_seq_used == (1, 2)


def test_layer_of():
    assert layer_of("blk.12.attn_q.weight") == 12 and layer_of("token_embd.weight") == -1


def test_format_helpers():
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(12) == "12 B"
    line = reply_summary({"n_prompt": 10, "n_generated": 20, "t_prompt_ms": 100, "t_gen_ms": 1000,
                          "ttft_ms": 120, "replay": {"sampling": {"seed": 7}}})
    assert line == "20.0 tok/s · prompt 10 tok @ 100.0 tok/s · first token 0.12 s · 20 tokens · seed 7"


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
