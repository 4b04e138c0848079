"""ConversationStore: conversations and messages in SQLite (WAL, one commit per sent message).

A message is committed the moment it is sent; a streaming reply is inserted when it starts and
its text is rewritten as it grows, so a crash loses at most the last second of one reply.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: a regenerated reply gets a new id
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""
SCHEMA_VERSION = 1


@dataclass
class Message:
    role: str  # "user" | "assistant" | "system"
    content: str
    id: int = 0
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    updated: float


class ConversationStore:
    def __init__(self, path: str | Path):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        # a write at open, so that a read-only file fails here and not at the user's first message
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._db.commit()

    @classmethod
    def read_only_copy(cls, path: str | Path) -> ConversationStore:
        """An in-memory store holding what can be read of the history at `path` (else empty)."""
        store = cls(":memory:")
        # immutable=1 reads a WAL file in a read-only folder, where sqlite cannot create its -shm
        for query in ("mode=ro", "immutable=1"):
            try:
                source = sqlite3.connect(f"{Path(path).resolve().as_uri()}?{query}", uri=True)
                try:
                    source.backup(store._db)
                finally:
                    source.close()
            except sqlite3.Error:
                continue
            store._db.executescript(SCHEMA)  # the copy replaced everything, tables included
            break
        return store

    def quick_check(self) -> str:
        """'' when sqlite finds the file sound, else its first complaint."""
        found = self._db.execute("PRAGMA quick_check").fetchone()[0]
        return "" if found == "ok" else found

    def close(self) -> None:
        self._db.close()

    # conversations ----------------------------------------------------------------------------
    def create(self, title: str = "New chat", system_prompt: str = "") -> int:
        now = time.time()
        with self._db:
            cur = self._db.execute(
                "INSERT INTO conversations(title, created, updated, system_prompt) VALUES (?,?,?,?)",
                (title, now, now, system_prompt),
            )
        return int(cur.lastrowid)

    def rename(self, conversation_id: int, title: str) -> None:
        with self._db:
            self._db.execute("UPDATE conversations SET title=? WHERE id=?", (title, conversation_id))

    def delete(self, conversation_id: int) -> None:
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    def title(self, conversation_id: int) -> str:
        row = self._db.execute("SELECT title FROM conversations WHERE id=?", (conversation_id,))
        found = row.fetchone()
        return found[0] if found else ""

    def list(self, search: str = "") -> list[Conversation]:
        if search:
            like = f"%{search}%"
            rows = self._db.execute(
                "SELECT DISTINCT c.id, c.title, c.updated FROM conversations c "
                "LEFT JOIN messages m ON m.conversation_id = c.id "
                "WHERE c.title LIKE ? OR m.content LIKE ? ORDER BY c.updated DESC",
                (like, like),
            )
        else:
            rows = self._db.execute("SELECT id, title, updated FROM conversations ORDER BY updated DESC")
        return [Conversation(*r) for r in rows]

    # messages ---------------------------------------------------------------------------------
    def add_message(self, conversation_id: int, message: Message) -> int:
        now = time.time()
        with self._db:
            cur = self._db.execute(
                "INSERT INTO messages(conversation_id, role, content, stats, created) VALUES (?,?,?,?,?)",
                (conversation_id, message.role, message.content, json.dumps(message.stats), now),
            )
            self._db.execute("UPDATE conversations SET updated=? WHERE id=?", (now, conversation_id))
        message.id = int(cur.lastrowid)
        return message.id

    def update_message(self, message_id: int, content: str, stats: dict | None = None) -> None:
        with self._db:
            if stats is None:
                self._db.execute("UPDATE messages SET content=? WHERE id=?", (content, message_id))
            else:
                self._db.execute(
                    "UPDATE messages SET content=?, stats=? WHERE id=?",
                    (content, json.dumps(stats), message_id),
                )

    def delete_from(self, conversation_id: int, message_id: int) -> None:
        """Delete message `message_id` and everything after it (edit / regenerate)."""
        with self._db:
            self._db.execute(
                "DELETE FROM messages WHERE conversation_id=? AND id>=?", (conversation_id, message_id)
            )

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute(
            "SELECT id, role, content, stats FROM messages WHERE conversation_id=? ORDER BY id",
            (conversation_id,),
        )
        return [Message(role, content, mid, json.loads(stats or "{}")) for mid, role, content, stats in rows]

    def import_json(self, text: str) -> int:
        """Add a conversation written by export_json; one transaction, so all of it or nothing."""
        data = json.loads(text)
        try:
            messages = [Message(str(m["role"]), str(m["content"]), stats=dict(m.get("stats") or {}))
                        for m in data["messages"]]
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"not a conversation exported by ggstation ({e!r})") from e
        now = time.time()
        with self._db:
            cur = self._db.execute(
                "INSERT INTO conversations(title, created, updated) VALUES (?,?,?)",
                (str(data.get("title") or "Imported chat"), now, now),
            )
            for m in messages:
                self._db.execute(
                    "INSERT INTO messages(conversation_id, role, content, stats, created) VALUES (?,?,?,?,?)",
                    (cur.lastrowid, m.role, m.content, json.dumps(m.stats), now),
                )
        return int(cur.lastrowid)

    # export -----------------------------------------------------------------------------------
    def export_json(self, conversation_id: int) -> str:
        data = {
            "title": self.title(conversation_id),
            "messages": [
                {"role": m.role, "content": m.content, **({"stats": m.stats} if m.stats else {})}
                for m in self.messages(conversation_id)
            ],
        }
        return json.dumps(data, indent=2, ensure_ascii=False)

    def export_markdown(self, conversation_id: int) -> str:
        parts = [f"# {self.title(conversation_id)}\n"]
        for m in self.messages(conversation_id):
            parts.append(f"## {m.role.capitalize()}\n\n{m.content}\n")
        return "\n".join(parts)
