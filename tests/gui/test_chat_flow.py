"""The real MainWindow driven with a FakeEngine: load, send, stream, stop, regenerate, edit, persist."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QStyleOptionViewItem

from .conftest import load, send
from .fake_engine import REPLY, FakeEngine


def test_load_shows_model_everywhere(loaded_window):
    w = loaded_window
    assert w.ctx.session is not None
    assert "tiny-llama" in w.llm_label.text() and "tiny-llama" in w.status.llm_label.text()
    assert w.dashboard.layer_model.rowCount() == len(w.ctx.session.layers())
    assert w.tabs.currentIndex() == 0


def test_send_streams_reply_and_records_stats(loaded_window, qtbot):
    w = loaded_window
    send(w, qtbot, "Hello there")
    model = w.chat.chat_model
    assert model.rowCount() == 2
    assert model.message(0).content == "Hello there"
    reply = model.message(1)
    assert reply.content == REPLY
    assert reply.stats["n_generated"] == len(REPLY.split(" "))
    assert reply.stats["replay"]["model_sha256"] == "0" * 64
    assert reply.stats["replay"]["sampling"]["seed"] >= 0  # a random seed is recorded
    assert w.chat_pane.gauge.used > 0 and w.chat_pane.gauge.n_ctx == w.ctx.session.n_ctx
    session = w.ctx.engine.sessions[-1]
    assert session.last_messages[0]["role"] == "system"
    assert session.last_messages[-1] == {"role": "user", "content": "Hello there"}


def test_stop_cancels_generation(make_window, qtbot, gguf_path):
    w = make_window(FakeEngine(reply=" ".join(["word"] * 500), delay=0.02))
    load(w, qtbot, gguf_path)
    w.chat_pane.input.setPlainText("long please")
    w.chat_pane.submit()
    qtbot.waitUntil(lambda: len(w.chat.chat_model.message(1).content) > 10, timeout=5000)
    with qtbot.waitSignal(w.chat.busy_changed, timeout=5000):
        qtbot.keyClick(w.chat_pane.input, Qt.Key.Key_Escape)
    reply = w.chat.chat_model.message(1)
    assert reply.stats["finish_reason"] == "stopped"
    assert 0 < reply.stats["n_generated"] < 500
    stored = w.ctx.store.messages(w.chat.conversation_id)[1]
    assert stored.content == reply.content  # the partial reply is kept


def test_regenerate_replaces_last_reply(loaded_window, qtbot):
    w = loaded_window
    send(w, qtbot, "Hi")
    first_id = w.chat.chat_model.message(1).id
    with qtbot.waitSignal(w.chat.busy_changed, check_params_cb=lambda b: b is False, timeout=5000):
        w.chat_pane.regenerate_requested.emit()
    assert w.chat.chat_model.rowCount() == 2
    assert w.chat.chat_model.message(1).id != first_id
    assert len(w.ctx.store.messages(w.chat.conversation_id)) == 2


def test_edit_resends_from_edited_message(loaded_window, qtbot):
    w = loaded_window
    send(w, qtbot, "first question")
    send(w, qtbot, "second question")
    w.chat_pane.begin_edit(0)
    assert w.chat_pane.input.toPlainText() == "first question"
    w.chat_pane.input.setPlainText("edited question")
    with qtbot.waitSignal(w.chat.busy_changed, check_params_cb=lambda b: b is False, timeout=5000):
        w.chat_pane.submit()
    contents = [m.content for m in w.chat.chat_model.messages()]
    assert contents == ["edited question", REPLY]
    assert [m.content for m in w.ctx.store.messages(w.chat.conversation_id)] == contents


def test_conversation_persists_across_restart(make_window, qtbot, gguf_path, data_dir):
    w = make_window()
    load(w, qtbot, gguf_path)
    send(w, qtbot, "remember me")
    w.close()
    w2 = make_window(FakeEngine(), data_dir)
    assert w2.chat.conversations.rowCount() == 1
    cid = w2.chat.conversations.conversation_id(0)
    w2.chat.open_conversation(cid)
    assert [m.content for m in w2.chat.chat_model.messages()] == ["remember me", REPLY]
    assert w2.chat_pane.title_label.text() == "remember me"


def test_user_message_is_stored_before_reply_starts(loaded_window, qtbot):
    w = loaded_window
    w.chat_pane.input.setPlainText("saved at once")
    w.chat_pane.submit()
    stored = w.ctx.store.messages(w.chat.conversation_id)
    assert stored[0].content == "saved at once"  # committed synchronously on send
    qtbot.waitUntil(lambda: not w.chat.busy(), timeout=5000)


def test_send_without_model_explains(window, qtbot):
    with qtbot.waitSignal(window.chat.failed) as blocker:
        window.chat.send("hello")
    assert "Load a model" in blocker.args[0]


def test_delegate_copy_action_copies_message(loaded_window, qtbot):
    w = loaded_window
    send(w, qtbot, "copy me")
    view, index = w.chat_pane.view, w.chat.chat_model.index(0)
    rect = w.chat_pane.delegate.action_rects(_option_for(view, index), index)["Copy"]
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert QGuiApplication.clipboard().text() == "copy me"


def test_sidebar_search_and_delete(loaded_window, qtbot):
    w = loaded_window
    send(w, qtbot, "about apples")
    w.chat.new_conversation()
    send(w, qtbot, "about pears")
    assert w.chat.conversations.rowCount() == 2
    w.sidebar.search.setText("apples")
    assert w.chat.conversations.rowCount() == 1
    w.sidebar.search.clear()
    w.chat.delete_conversation(w.chat.conversations.conversation_id(0))
    assert w.chat.conversations.rowCount() == 1


def test_context_overflow_drops_oldest_turns(make_window, qtbot, gguf_path):
    w = make_window()
    w.picker.load_panel.n_ctx.setValue(256)
    load(w, qtbot, gguf_path)
    w.ctx.settings.sampling = type(w.ctx.settings.sampling)(max_tokens=40)
    for i in range(12):
        send(w, qtbot, f"message number {i} " + "filler " * 10)
    stats = w.chat.chat_model.message(w.chat.chat_model.rowCount() - 1).stats
    assert stats["dropped_messages"] > 0
    assert (
        w.ctx.engine.sessions[-1].count_tokens(w.ctx.engine.sessions[-1].last_messages) + 40 <= 256
    )


def _option_for(view, index):
    option = QStyleOptionViewItem()
    option.rect = view.visualRect(index)
    option.font, option.palette, option.fontMetrics = (
        view.font(),
        view.palette(),
        view.fontMetrics(),
    )
    return option


def test_code_block_copy_button_copies_code(loaded_window, qtbot):
    w = loaded_window
    send(w, qtbot, "show code")
    view, index = w.chat_pane.view, w.chat.chat_model.index(1)
    layout = w.chat_pane.delegate._layout(_option_for(view, index), index)
    ((code, rect),) = layout.code_copies
    assert code == "print('hi')"
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert QGuiApplication.clipboard().text() == "print('hi')"


def _save_dialog_answering(path):
    """A stand-in for QFileDialog.getSaveFileName that picks `path`."""
    return lambda *a, **k: (str(path), "")


def test_rename_and_export(loaded_window, qtbot, tmp_path, monkeypatch):
    w = loaded_window
    send(w, qtbot, "export me")
    cid = w.chat.conversation_id
    w.chat.conversations.setData(w.chat.conversations.index(0), "Renamed")
    assert w.ctx.store.title(cid) == "Renamed" and w.chat_pane.title_label.text() == "Renamed"
    for fmt in ("md", "json"):
        target = tmp_path / f"out.{fmt}"
        monkeypatch.setattr(
            "app.main_window.QFileDialog.getSaveFileName", _save_dialog_answering(target)
        )
        w.on_sidebar_export_requested(cid, fmt)
        assert "export me" in target.read_text()
