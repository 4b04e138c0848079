"""The data folder going bad: a damaged history or settings file, a read-only folder, a full disk.

The app must always start, say what is wrong in the window, keep the damaged file aside (never
delete it) and never let a failed write escape a Qt slot or drop what the user has on screen.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.settings import default_settings
from app.storage import ConversationStore, Message

from .conftest import load, send
from .fake_engine import FakeEngine

DB = "conversations.sqlite3"


def banner(w) -> str:
    """The notice shown in the window, or '' when none is visible."""
    return w.banner.text() if w.banner.isVisible() else ""


def history(directory: Path, title: str = "Kept", text: str = "hello from before") -> None:
    store = ConversationStore(directory / DB)
    store.add_message(store.create(title), Message("user", text))
    store.close()


class FullDisk:
    """A store connection whose reads work and whose every write fails as on a full disk."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def execute(self, sql: str, params=()):
        if sql.split()[0].upper() in ("INSERT", "UPDATE", "DELETE", "REPLACE"):
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, params)

    def __enter__(self):
        return self._db.__enter__()

    def __exit__(self, *exc):
        return self._db.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._db, name)


# a damaged history at start ---------------------------------------------------------------------
def _random(path: Path) -> bytes:
    data = os.urandom(4096)
    path.write_bytes(data)
    return data


def _truncated(path: Path) -> bytes:
    history(path.parent)
    for i in range(200):  # enough pages that half the file cuts through the tables
        history(path.parent, f"c{i}", "x" * 400)
    data = path.read_bytes()[: path.stat().st_size // 2]
    for sibling in (path.with_name(DB + "-wal"), path.with_name(DB + "-shm")):
        sibling.unlink(missing_ok=True)
    path.write_bytes(data)
    return data


def _with_wal(path: Path) -> bytes:
    data = _random(path)
    path.with_name(DB + "-wal").write_bytes(b"wal bytes")
    path.with_name(DB + "-shm").write_bytes(b"shm bytes")
    return data


@pytest.mark.parametrize("damage", [_random, _truncated, _with_wal])
def test_damaged_history_is_set_aside_and_app_starts(
    make_window, data_dir, damage, qtbot, gguf_path
):
    path = Path(data_dir) / DB
    original = damage(path)
    w = make_window()
    assert "could not be read" in banner(w) and ".corrupt-" in banner(w)
    aside = [p for p in Path(data_dir).iterdir() if p.name.startswith(DB + ".corrupt-")]
    kept = next(p for p in aside if not p.name.endswith(("-wal", "-shm")))
    assert kept.read_bytes() == original and kept.name in banner(
        w
    )  # never deleted, named in the banner
    if damage is _with_wal:  # siblings keep sqlite's naming, so the kept copy opens with its log
        assert (kept.parent / (kept.name + "-wal")).read_bytes() == b"wal bytes"
        assert (
            kept.parent / (kept.name + "-shm")
        ).exists()  # an index sqlite rebuilds: it may rewrite it
    load(w, qtbot, gguf_path)
    send(w, qtbot, "a fresh start")
    assert [m.content for m in ConversationStore(path).messages(w.chat.conversation_id)][
        0
    ] == "a fresh start"


def test_history_path_that_is_a_directory_is_set_aside(make_window, data_dir):
    (Path(data_dir) / DB / "inside").mkdir(parents=True)
    w = make_window()
    assert "could not be read" in banner(w)
    aside = next(Path(data_dir).glob(DB + ".corrupt-*"))
    assert (aside / "inside").is_dir() and (Path(data_dir) / DB).is_file()


def test_damaged_history_that_cannot_be_moved_aside(make_window, data_dir, monkeypatch):
    path = Path(data_dir) / DB
    original = _random(path)

    def refuse(_path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("app.data_folder.set_aside", refuse)
    w = make_window()
    assert "could not be moved aside (Permission denied)" in banner(
        w
    ) and "will not be saved" in banner(w)
    assert path.read_bytes() == original and w.ctx.store.path == ":memory:"


def test_healthy_folder_shows_no_banner(make_window, data_dir):
    history(Path(data_dir))
    w = make_window()
    assert banner(w) == "" and w.chat.conversations.rowCount() == 1


# a folder the app cannot write ------------------------------------------------------------------
def chmod_stops_writes(folder: Path) -> bool:
    """False for root (or CAP_DAC_OVERRIDE), who writes through chmod 0o555."""
    probe = folder / "probe"
    probe.mkdir()
    probe.chmod(0o555)
    try:
        (probe / "file").touch()
    except PermissionError:
        return True
    finally:
        probe.chmod(0o755)
        (probe / "file").unlink(missing_ok=True)
        probe.rmdir()
    return False


@pytest.fixture
def read_only(monkeypatch, tmp_path):
    """read_only(folder): make `folder` unwritable; where chmod does not stop writes (root), the
    store's sqlite connections open read-only instead (what sqlite does on a read-only file)."""
    made: list[Path] = []

    def make(folder: Path) -> None:
        if chmod_stops_writes(tmp_path):
            folder.chmod(0o555)
            made.append(folder)
            return
        real = sqlite3.connect

        def connect(database, *args, **kwargs):
            if str(database).startswith(str(folder)):
                return real(f"{Path(database).as_uri()}?mode=ro", *args, uri=True, **kwargs)
            return real(database, *args, **kwargs)

        monkeypatch.setattr("app.storage.sqlite3.connect", connect)

    yield make
    for folder in made:
        folder.chmod(0o755)


def test_read_only_folder_keeps_history_in_memory(
    make_window, data_dir, read_only, qtbot, gguf_path
):
    history(Path(data_dir))
    read_only(Path(data_dir))
    w = make_window()
    assert "history will not be saved" in banner(w) and "read-only" in banner(w)
    assert w.chat.conversations.rowCount() == 1  # the old history is still shown
    load(w, qtbot, gguf_path)
    send(w, qtbot, "only in memory")
    assert w.chat.chat_model.message(0).content == "only in memory"
    assert w.chat.conversations.rowCount() == 2
    assert [c.title for c in ConversationStore.read_only_copy(Path(data_dir) / DB).list()] == [
        "Kept"
    ]


def test_folder_that_cannot_be_created(make_window, tmp_path, qtbot, gguf_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    w = make_window(directory=str(blocker / "data"))
    assert "history will not be saved" in banner(w) and "Settings will not be saved" in banner(w)
    load(w, qtbot, gguf_path)
    send(w, qtbot, "still works")
    assert w.chat.chat_model.rowCount() == 2
    assert w.ctx.save() is False  # and at exit it fails quietly (a log line), not with a traceback


# a write failing inside a slot --------------------------------------------------------------------
@pytest.fixture
def full_disk_window(make_window, qtbot, gguf_path):
    """A loaded window with one saved conversation, whose store then runs out of disk."""
    w = make_window()
    load(w, qtbot, gguf_path)
    send(w, qtbot, "saved earlier")
    w.ctx.store._db = FullDisk(w.ctx.store._db)
    return w


def test_send_on_full_disk_keeps_the_message(full_disk_window, qtbot):
    w = full_disk_window
    with qtbot.captureExceptions() as exceptions:
        send(w, qtbot, "please do not lose me")
    assert exceptions == []
    rows = [w.chat.chat_model.message(i).content for i in range(w.chat.chat_model.rowCount())]
    assert rows[0] == "saved earlier" and rows[2] == "please do not lose me" and rows[3]
    assert "not saved" in banner(w) and "disk is full" in banner(w)
    from app.item_models.chat_list_model import ERROR_ROLE

    assert "Not saved" in w.chat.chat_model.index(2).data(ERROR_ROLE)


def test_first_message_of_new_chat_on_full_disk(full_disk_window, qtbot):
    w = full_disk_window
    w.chat.new_conversation()
    with qtbot.captureExceptions() as exceptions:
        send(w, qtbot, "new chat, no room")
    assert exceptions == []
    assert w.chat.chat_model.message(0).content == "new chat, no room"
    assert "not saved" in banner(w) and w.chat.conversations.rowCount() == 1


def test_rename_on_full_disk(full_disk_window, qtbot):
    w = full_disk_window
    model = w.chat.conversations
    old = model.index(0).data()
    with qtbot.captureExceptions() as exceptions:
        model.setData(
            model.index(0), "Renamed", Qt.ItemDataRole.EditRole
        )  # what the view's editor does
    assert exceptions == []
    assert "not saved" in banner(w)
    qtbot.waitUntil(lambda: model.index(0).data() == old)  # shows what is really stored
    assert model.rowCount() == 1


def test_delete_on_full_disk(full_disk_window, qtbot):
    w = full_disk_window
    cid = w.chat.conversation_id
    with qtbot.captureExceptions() as exceptions:
        w.sidebar.delete_requested.emit(cid)
    assert exceptions == []
    assert "not deleted" in banner(w)
    assert w.chat.conversations.rowCount() == 1 and w.chat.chat_model.rowCount() == 2


def test_regenerate_on_full_disk_keeps_the_reply(full_disk_window, qtbot):
    w = full_disk_window
    reply = w.chat.chat_model.message(1).content
    with qtbot.captureExceptions() as exceptions:
        w.chat_pane.regenerate_requested.emit()
    assert exceptions == [] and not w.chat.busy()
    assert w.chat.chat_model.rowCount() == 2 and w.chat.chat_model.message(1).content == reply
    assert "disk is full" in banner(w)


def test_import_on_full_disk(full_disk_window, qtbot, tmp_path, monkeypatch):
    w = full_disk_window
    exported = tmp_path / "chat.json"
    exported.write_text(w.ctx.store.export_json(w.chat.conversation_id), encoding="utf-8")
    monkeypatch.setattr(
        "app.main_window.QFileDialog.getOpenFileName", lambda *a, **k: (str(exported), "")
    )
    with qtbot.captureExceptions() as exceptions:
        w.sidebar.import_requested.emit()
    assert exceptions == []
    assert "not imported" in banner(w) and w.chat.conversations.rowCount() == 1


def test_import_round_trip_and_bad_file(window, qtbot, tmp_path, monkeypatch):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(
        '{"title": "Imported", "messages": [{"role": "user", "content": "hi"},'
        ' {"role": "assistant", "content": "hello", "stats": {"n_generated": 1}}]}'
    )
    bad.write_text("{not json")
    chosen = [str(good)]
    monkeypatch.setattr(
        "app.main_window.QFileDialog.getOpenFileName", lambda *a, **k: (chosen[0], "")
    )
    window.sidebar.import_requested.emit()
    assert window.chat.conversations.index(0).data() == "Imported"
    assert [m.content for m in window.chat.chat_model.messages()] == ["hi", "hello"]
    chosen[0] = str(bad)
    with qtbot.captureExceptions() as exceptions:
        window.sidebar.import_requested.emit()
    assert exceptions == [] and "not imported" in banner(window)
    assert window.chat.conversations.rowCount() == 1


def test_export_to_unwritable_place(full_disk_window, qtbot, tmp_path, monkeypatch):
    w = full_disk_window
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = str(blocker / "chat.md")  # a path under a file: fails for root too
    monkeypatch.setattr("app.main_window.QFileDialog.getSaveFileName", lambda *a, **k: (target, ""))
    with qtbot.captureExceptions() as exceptions:
        w.sidebar.export_requested.emit(w.chat.conversation_id, "md")
    assert exceptions == [] and "not exported" in banner(w)


def test_locked_database_on_send(make_window, data_dir, qtbot, gguf_path):
    w = make_window()
    load(w, qtbot, gguf_path)
    send(w, qtbot, "first")
    w.ctx.store._db.execute("PRAGMA busy_timeout=50")
    other = sqlite3.connect(Path(data_dir) / DB)
    other.execute("BEGIN EXCLUSIVE")  # another program holds the write lock
    try:
        with qtbot.captureExceptions() as exceptions:
            send(w, qtbot, "second")
    finally:
        other.rollback()
        other.close()
    assert exceptions == [] and w.chat.chat_model.message(2).content == "second"
    assert "another program" in banner(w)


# settings ---------------------------------------------------------------------------------------
def test_garbled_settings_file_is_set_aside(make_window, data_dir):
    ini = Path(data_dir) / "settings.ini"
    ini.write_bytes(b"\x00\xff" + os.urandom(2000))
    original = ini.read_bytes()
    w = make_window()
    assert w.ctx.settings == default_settings()
    kept = next(Path(data_dir).glob("settings.ini.corrupt-*"))
    assert kept.read_bytes() == original and "Settings" in banner(w) and kept.name in banner(w)


def test_settings_with_bad_values_keep_the_good_ones(make_window, data_dir):
    ini = Path(data_dir) / "settings.ini"
    ini.write_text('[General]\nload={not json\nsystem_prompt="\\"Be brief.\\""\n', encoding="utf-8")
    w = make_window()
    assert (
        w.ctx.settings.system_prompt == "Be brief."
        and w.ctx.settings.load == default_settings().load
    )
    assert "settings could not be read (load)" in banner(w)
    assert "{not json" in next(Path(data_dir).glob("settings.ini.corrupt-*")).read_text()
    w.close()
    w2 = make_window(FakeEngine(), data_dir)
    assert banner(w2) == ""  # the bad value is not reported again


def test_banner_can_be_dismissed(make_window, data_dir, qtbot):
    (Path(data_dir) / DB).write_bytes(b"garbage" * 100)
    w = make_window()
    assert banner(w)
    qtbot.mouseClick(w.banner.close_button, Qt.MouseButton.LeftButton)
    assert banner(w) == ""
