"""ConversationStore: every sent message is committed at once, WAL mode, edit/regenerate truncation."""

from __future__ import annotations

import json
import sqlite3

from app.storage import ConversationStore, Message


def test_store_commits_each_message_immediately(tmp_path):
    path = tmp_path / "c.sqlite3"
    store = ConversationStore(path)
    cid = store.create("t")
    store.add_message(cid, Message("user", "hello"))
    other = sqlite3.connect(path)  # a second connection sees it without close(): a crash keeps it
    assert other.execute("SELECT content FROM messages").fetchall() == [("hello",)]
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_store_delete_from_drops_the_tail(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    cid = store.create("t")
    ids = [
        store.add_message(cid, Message(r, t))
        for r, t in (("user", "a"), ("assistant", "b"), ("user", "c"))
    ]
    store.delete_from(cid, ids[1])
    assert [m.content for m in store.messages(cid)] == ["a"]


def test_store_search_finds_titles_and_contents(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    a, b = store.create("apples"), store.create("pears")
    store.add_message(b, Message("user", "tell me about KV caches"))
    assert [c.id for c in store.list("apple")] == [a]
    assert [c.id for c in store.list("kv cache")] == [b]
    assert len(store.list()) == 2


def test_store_export_markdown_and_json(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    cid = store.create("Demo")
    store.add_message(cid, Message("user", "hi"))
    store.add_message(cid, Message("assistant", "hello", stats={"n_generated": 1}))
    md = store.export_markdown(cid)
    assert md.startswith("# Demo") and "## Assistant\n\nhello" in md
    data = json.loads(store.export_json(cid))
    assert data["messages"][1] == {
        "role": "assistant",
        "content": "hello",
        "stats": {"n_generated": 1},
    }


def test_store_rename_and_delete_cascade(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    cid = store.create("old")
    store.add_message(cid, Message("user", "x"))
    store.rename(cid, "new")
    assert store.title(cid) == "new"
    store.delete(cid)
    assert store.list() == [] and store.messages(cid) == []
