"""The history store against hostile imports and a second process opening the same new file."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from app import storage
from app.storage import ConversationStore, ImportFormatError, Message

from .conftest import send

RACE_ROUNDS = 25
DEEP = 100_000
GOOD = {
    "title": "Good",
    "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "stats": {"n_generated": 1}},
    ],
}


def _export(**change) -> str:
    data = json.loads(json.dumps(GOOD))
    data["messages"][1].update(change)
    return json.dumps(data)


HOSTILE = {
    "nested lists": "[" * DEEP + "]" * DEEP,
    "nested objects": '{"a":' * DEEP + "1" + "}" * DEEP,
    "nested stats": _export(stats="STATS").replace('"STATS"', '{"a":' * DEEP + "1" + "}" * DEEP),
    "stats nested 900 deep": _export(stats="STATS").replace(
        '"STATS"', '{"a":' * 900 + "1" + "}" * 900
    ),
    "not json": "{not json",
    "empty": "",
    "an integer of 5000 digits": '{"messages": [], "title": ' + "7" * 5000 + "}",
    "a list at the top": json.dumps([GOOD]),
    "messages an object": json.dumps({"messages": {"role": "user", "content": "x"}}),
    "messages text": json.dumps({"messages": "hello"}),
    "a message a list": json.dumps({"messages": [["user", "hi"]]}),
    "content a number": _export(content=5),
    "content an object": _export(content={"text": "hi"}),
    "content null": _export(content=None),
    "unknown role": _export(role="root"),
    "role a list": _export(role=["user"]),
    "title a list": json.dumps({**GOOD, "title": ["x"]}),
    "stats a list": _export(stats=[1, 2]),
    "a count as text": _export(stats={"n_prompt": "many"}),
    "a count too large for Qt": _export(stats={"n_generated": 2**40}),
    "a count that is a boolean": _export(stats={"n_generated": True}),
    "a time as text": _export(stats={"ttft_ms": "soon"}),
    "a time that is infinite": _export(stats="STATS").replace('"STATS"', '{"t_gen_ms": Infinity}'),
    "replay as text": _export(stats={"replay": "x"}),
    "sampling as a list": _export(stats={"replay": {"sampling": [1]}}),
    "finish reason an object": _export(stats={"finish_reason": {}}),
    "a lone surrogate": _export(content="SURR").replace("SURR", "\\ud800"),
    "a lone surrogate in stats": _export(stats={"replay": {"model": "SURR"}}).replace(
        "SURR", "\\udfff"
    ),
}


def banner(w) -> str:
    return w.banner.text() if w.banner.isVisible() else ""


@pytest.fixture
def pick(monkeypatch):
    """pick(path): the import dialog chooses `path`."""
    chosen = [""]
    monkeypatch.setattr(
        "app.main_window.QFileDialog.getOpenFileName", lambda *a, **k: (chosen[0], "")
    )

    def choose(path) -> None:
        chosen[0] = str(path)

    return choose


def _import_through_the_button(window, qtbot, pick, path) -> list:
    pick(path)
    with qtbot.captureExceptions() as exceptions:
        window.sidebar.import_button.click()
        qtbot.wait(20)  # paint whatever was opened
    return exceptions


def _still_imports(window, qtbot, pick, tmp_path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD), encoding="utf-8")
    before = window.chat.conversations.rowCount()
    assert _import_through_the_button(window, qtbot, pick, good) == []
    assert window.chat.conversations.rowCount() == before + 1
    assert [m.content for m in window.chat.chat_model.messages()] == ["hi", "hello"]


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_import_hostile_file_shows_an_error_and_changes_nothing(
    window, qtbot, pick, tmp_path, case
):
    path = tmp_path / "hostile.json"
    path.write_text(HOSTILE[case], encoding="utf-8")
    exceptions = _import_through_the_button(window, qtbot, pick, path)
    assert exceptions == []
    assert "hostile.json was not imported" in banner(window)
    assert window.chat.conversations.rowCount() == 0 and window.ctx.store.list() == []
    _still_imports(window, qtbot, pick, tmp_path)


def test_import_deep_file_keeps_the_chat_usable(loaded_window, qtbot, pick, tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * DEEP, encoding="utf-8")
    assert _import_through_the_button(loaded_window, qtbot, pick, path) == []
    assert "deep.json was not imported: it is nested too deeply." in banner(loaded_window)
    send(loaded_window, qtbot, "still there?")
    assert [m.role for m in loaded_window.chat.chat_model.messages()] == ["user", "assistant"]


def test_import_bounds_the_bytes_it_reads(window, qtbot, pick, tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "MAX_IMPORT_BYTES", 1024)
    path = tmp_path / "big.json"
    path.write_text(_export(content="x" * 2000), encoding="utf-8")
    assert _import_through_the_button(window, qtbot, pick, path) == []
    assert "big.json was not imported: it is larger than" in banner(window)
    assert window.ctx.store.list() == []


def test_import_rejects_what_is_not_a_regular_utf8_file(window, qtbot, pick, tmp_path):
    latin = tmp_path / "latin.json"
    latin.write_bytes(_export(content="caf\u00e9").replace("\\u00e9", "\xe9").encode("latin-1"))
    folder = tmp_path / "folder.json"
    folder.mkdir()
    for path, words in ((latin, "it is not UTF-8 text"), (folder, "was not imported")):
        assert _import_through_the_button(window, qtbot, pick, path) == []
        assert f"{path.name} was not imported" in banner(window) and words in banner(window)
    assert window.ctx.store.list() == []
    _still_imports(window, qtbot, pick, tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_import_refuses_a_fifo_without_blocking(window, qtbot, pick, tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # reading a FIFO nobody writes to would block the window for ever
    assert _import_through_the_button(window, qtbot, pick, fifo) == []
    assert "fifo.json was not imported: it is not a regular file." in banner(window)
    _still_imports(window, qtbot, pick, tmp_path)


def test_import_accepts_a_bom_and_what_the_app_exports(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    cid = store.create("Round trip")
    store.add_message(cid, Message("user", "hé \x00 ✓"))
    store.add_message(
        cid,
        Message(
            "assistant",
            "ok",
            stats={
                "n_prompt": 3,
                "n_generated": 1,
                "n_cached": 0,
                "t_prompt_ms": 1.5,
                "t_gen_ms": 2,
                "ttft_ms": None,
                "finish_reason": "stop",
                "dropped_messages": 0,
                "replay": {
                    "model": "m.gguf",
                    "sampling": {"seed": 1, "temperature": 0.7},
                    "n_ctx": 4096,
                },
            },
        ),
    )
    path = tmp_path / "export.json"
    path.write_bytes(b"\xef\xbb\xbf" + store.export_json(cid).encode("utf-8"))
    copy = store.import_file(path)
    assert store.export_json(copy) == store.export_json(cid)


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("nested lists", "it is nested too deeply"),
        ("not json", "it is not valid JSON (Expecting property name"),
        ("a list at the top", "it holds a JSON list, not an object"),
        ("messages text", "its messages are a text, not a list"),
        ("content a number", "the content of message 2 is a number, not text"),
        ("unknown role", "the role of message 2 is not one of user, assistant, system"),
        ("a count as text", "the stats of message 2: n_prompt is not a count of tokens"),
        ("stats nested 900 deep", "the stats of message 2 are nested more than"),
        ("a lone surrogate", "the content of message 2 holds an invalid character"),
    ],
)
def test_parse_export_names_what_is_wrong(case, words):
    with pytest.raises(ImportFormatError) as caught:
        storage.parse_export(HOSTILE[case])
    assert str(caught.value).startswith(words)


def test_import_json_turns_memory_error_into_a_format_error(tmp_path, monkeypatch):
    def too_big(text):
        raise MemoryError

    monkeypatch.setattr(storage.json, "loads", too_big)
    store = ConversationStore(tmp_path / "c.sqlite3")
    with pytest.raises(ImportFormatError, match="too large"):
        store.import_json("{}")


def _open_in_lockstep(barrier, paths: list[str], results) -> None:
    """Open each fresh `path` at the same moment as the other process, and write to it."""
    for path in paths:
        barrier.wait()
        try:
            store = ConversationStore(path)
            store.add_message(store.create("race"), Message("user", "hi"))
            store.close()
            results.put("ok")
        except Exception as e:  # the test wants every failure, in words
            results.put(f"{type(e).__name__}: {e}")


def test_store_two_processes_open_a_new_file_at_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")  # no forked copy of the test's Qt state
    paths = [str(tmp_path / f"race{i}" / "conversations.sqlite3") for i in range(RACE_ROUNDS)]
    barrier, results = ctx.Barrier(2), ctx.Queue()
    workers = [
        ctx.Process(target=_open_in_lockstep, args=(barrier, paths, results)) for _ in range(2)
    ]
    for w in workers:
        w.start()
    outcomes = [results.get(timeout=30) for _ in range(2 * RACE_ROUNDS)]
    for w in workers:
        w.join(timeout=10)
    assert outcomes == ["ok"] * (2 * RACE_ROUNDS)
    for path in paths:
        store = ConversationStore(path)
        assert len(store.list()) == 2 and store.quick_check() == ""
        store.close()
