"""ConversationStore: conversations and messages in SQLite (WAL, one commit per sent message).

A message is committed the moment it is sent; a streaming reply is inserted when it starts and
its text is rewritten as it grows, so a crash loses at most the last second of one reply.
An imported JSON file is read with a size bound and checked at every level before anything is
written: a hostile file raises ImportFormatError (a ValueError) and changes nothing.
"""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .vision_files import ImageAttachment

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
-- attached images: the bytes once per content (sha256), and which message shows them in order
CREATE TABLE IF NOT EXISTS images (
    sha256 TEXT PRIMARY KEY,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS message_images (
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (message_id, position)
);
CREATE INDEX IF NOT EXISTS message_images_by_sha ON message_images(sha256);
"""
SCHEMA_VERSION = 1

# how long a statement waits for another process's lock on the file (sqlite3's default, made
# explicit: longer would freeze the window longer when another program holds the file)
BUSY_TIMEOUT_S = 5.0
# Switching to WAL and creating the schema can fail with SQLITE_BUSY at once, busy timeout or not
# (sqlite refuses to wait where waiting could deadlock), when a second process opens the same new
# file at the same moment; the whole setup is retried for this long.
OPEN_RETRY_S = 10.0

MAX_IMPORT_BYTES = (
    64 * 1024 * 1024
)  # an export far larger than any chat; bounds the memory an import takes
MAX_STATS_DEPTH = 16  # the app writes 3 levels (stats.replay.sampling)
ROLES = ("user", "assistant", "system")
# the stats the window reads: token counts go through Qt int signals (32 bits), times are shown
_COUNT_STATS = ("n_prompt", "n_generated", "n_cached", "dropped_messages")
_TIME_STATS = ("t_prompt_ms", "t_gen_ms", "ttft_ms")
MAX_COUNT = 2**30  # two of them still add up below 2**31


class ImportFormatError(ValueError):
    """The file to import is not a conversation exported by ggstation; the words say why."""


@dataclass
class Message:
    role: str  # "user" | "assistant" | "system"
    content: str
    id: int = 0
    stats: dict = field(default_factory=dict)
    # in the order their markers stand in the prompt; kept as bytes, so reopening needs no file
    images: list[ImageAttachment] = field(default_factory=list)


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
        self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
        # not closed when this fails: closing a damaged file's connection deletes its -wal, which
        # data_folder sets aside with it
        self._set_up()

    def _set_up(self) -> None:
        deadline = time.monotonic() + OPEN_RETRY_S
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.execute("PRAGMA foreign_keys=ON")
                # BEGIN IMMEDIATE takes the write lock first (waiting on the busy timeout) rather
                # than upgrading a read lock mid-script, which sqlite refuses without waiting. The
                # user_version write makes a read-only file fail here, not at the first message.
                self._db.executescript(
                    f"BEGIN IMMEDIATE;\n{SCHEMA}\nPRAGMA user_version={SCHEMA_VERSION};\nCOMMIT;"
                )
                return
            except sqlite3.OperationalError as e:
                if self._db.in_transaction:
                    self._db.rollback()
                if not _is_busy(e) or time.monotonic() > deadline:
                    raise
            time.sleep(random.uniform(0.005, 0.05))  # jitter, so that two openers fall out of step

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
            self._db.execute(
                "UPDATE conversations SET title=? WHERE id=?", (title, conversation_id)
            )

    def delete(self, conversation_id: int) -> None:
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))
            self._drop_unused_images()

    def _drop_unused_images(self) -> None:
        """Image bytes no message shows any more (inside the caller's transaction)."""
        self._db.execute(
            "DELETE FROM images WHERE sha256 NOT IN (SELECT sha256 FROM message_images)"
        )

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
            rows = self._db.execute(
                "SELECT id, title, updated FROM conversations ORDER BY updated DESC"
            )
        return [Conversation(*r) for r in rows]

    # messages ---------------------------------------------------------------------------------
    def add_message(self, conversation_id: int, message: Message) -> int:
        now = time.time()
        with self._db:
            cur = self._db.execute(
                "INSERT INTO messages(conversation_id, role, content, stats, created) VALUES (?,?,?,?,?)",
                (conversation_id, message.role, message.content, json.dumps(message.stats), now),
            )
            self._db.execute(
                "UPDATE conversations SET updated=? WHERE id=?", (now, conversation_id)
            )
            self._insert_images(int(cur.lastrowid), message.images)
        message.id = int(cur.lastrowid)
        return message.id

    def _insert_images(self, message_id: int, images: list[ImageAttachment]) -> None:
        for position, image in enumerate(images):
            self._db.execute(
                "INSERT OR IGNORE INTO images(sha256, data) VALUES (?,?)",
                (image.sha256, image.data),
            )
            self._db.execute(
                "INSERT INTO message_images(message_id, position, sha256, name) VALUES (?,?,?,?)",
                (message_id, position, image.sha256, image.name),
            )

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
                "DELETE FROM messages WHERE conversation_id=? AND id>=?",
                (conversation_id, message_id),
            )
            self._drop_unused_images()

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute(
            "SELECT id, role, content, stats FROM messages WHERE conversation_id=? ORDER BY id",
            (conversation_id,),
        )
        out = [
            Message(role, content, mid, json.loads(stats or "{}"))
            for mid, role, content, stats in rows
        ]
        by_id = {m.id: m for m in out}
        # one query for the whole conversation; a missing blob comes back empty, and the bubble
        # shows a placeholder for it as for bytes that no longer decode
        images = self._db.execute(
            "SELECT mi.message_id, mi.sha256, mi.name, i.data FROM message_images mi "
            "JOIN messages m ON m.id = mi.message_id LEFT JOIN images i ON i.sha256 = mi.sha256 "
            "WHERE m.conversation_id=? ORDER BY mi.message_id, mi.position",
            (conversation_id,),
        )
        for mid, sha, name, data in images:
            by_id[mid].images.append(ImageAttachment(bytes(data or b""), sha, name))
        return out

    def import_file(self, path: str | Path) -> int:
        """import_json of the file at `path`, read only if it is a regular file of at most
        MAX_IMPORT_BYTES (a FIFO would block the window, a huge file would fill the memory)."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with open(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ImportFormatError("it is not a regular file")
            data = f.read(MAX_IMPORT_BYTES + 1)
        if len(data) > MAX_IMPORT_BYTES:
            raise ImportFormatError(f"it is larger than {MAX_IMPORT_BYTES // (1024 * 1024)} MiB")
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise ImportFormatError(f"it is not UTF-8 text (byte {e.start})") from None
        return self.import_json(text)

    def import_json(self, text: str) -> int:
        """Add a conversation written by export_json; one transaction, so all of it or nothing."""
        title, messages = parse_export(text)
        now = time.time()
        with self._db:
            cur = self._db.execute(
                "INSERT INTO conversations(title, created, updated) VALUES (?,?,?)",
                (title, now, now),
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


# import checks ------------------------------------------------------------------------------------
def parse_export(text: str) -> tuple[str, list[Message]]:
    """The title and messages of an export_json text; ImportFormatError for anything else."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ImportFormatError("it is nested too deeply") from None
    except MemoryError:
        raise ImportFormatError("it is too large to read") from None
    except ValueError as e:  # JSONDecodeError, or an integer of too many digits
        raise ImportFormatError(f"it is not valid JSON ({_short(e)})") from None
    if not isinstance(data, dict):
        raise ImportFormatError(f"it holds a JSON {_kind(data)}, not an object")
    title = data.get("title")
    if title is not None and not isinstance(title, str):
        raise ImportFormatError(f"its title is a {_kind(title)}, not text")
    _check_text(title or "", "the title")
    found = data.get("messages")
    if not isinstance(found, list):
        raise ImportFormatError(
            "it has no list of messages"
            if found is None
            else f"its messages are a {_kind(found)}, not a list"
        )
    return title or "Imported chat", [_message(i, m) for i, m in enumerate(found)]


def _message(i: int, m: Any) -> Message:
    where = f"message {i + 1}"
    if not isinstance(m, dict):
        raise ImportFormatError(f"{where} is a {_kind(m)}, not an object")
    role, content, stats = m.get("role"), m.get("content"), m.get("stats")
    if role not in ROLES:
        raise ImportFormatError(f"the role of {where} is not one of {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise ImportFormatError(f"the content of {where} is a {_kind(content)}, not text")
    _check_text(content, f"the content of {where}")
    if stats is None:
        stats = {}
    if not isinstance(stats, dict):
        raise ImportFormatError(f"the stats of {where} are a {_kind(stats)}, not an object")
    _check_stats(stats, f"the stats of {where}")
    return Message(role, content, stats=stats)


def _check_stats(stats: dict, where: str) -> None:
    """The fields the window reads have the types it reads them as; the rest is plain JSON,
    shallow enough to store and read back, with text sqlite can store."""
    for key in _COUNT_STATS:
        value = stats.get(key)
        if value is not None and not (type(value) is int and 0 <= value < MAX_COUNT):
            raise ImportFormatError(f"{where}: {key} is not a count of tokens")
    for key in _TIME_STATS:
        value = stats.get(key)
        if value is not None and not (type(value) in (int, float) and math.isfinite(value)):
            raise ImportFormatError(f"{where}: {key} is not a time in milliseconds")
    if not isinstance(stats.get("finish_reason"), (str, type(None))):
        raise ImportFormatError(f"{where}: finish_reason is not text")
    replay = stats.get("replay", {})
    if not isinstance(replay, dict) or not isinstance(replay.get("sampling", {}), dict):
        raise ImportFormatError(
            f"{where}: replay is not an object with an object of sampling settings"
        )
    pending: list[tuple[Any, int]] = [(stats, 1)]  # a loop, not recursion: the depth is the input's
    while pending:
        value, depth = pending.pop()
        if depth > MAX_STATS_DEPTH:
            raise ImportFormatError(f"{where} are nested more than {MAX_STATS_DEPTH} deep")
        if isinstance(value, dict):
            for k, v in value.items():
                _check_text(k, where)
                pending.append((v, depth + 1))
        elif isinstance(value, list):
            pending.extend((v, depth + 1) for v in value)
        elif isinstance(value, str):
            _check_text(value, where)


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape: sqlite cannot store it
        raise ImportFormatError(f"{where} holds an invalid character (a lone surrogate)") from None


def _kind(value: Any) -> str:
    return {
        dict: "object",
        list: "list",
        str: "text",
        bool: "boolean",
        int: "number",
        float: "number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _short(e: BaseException, limit: int = 120) -> str:
    text = str(e)
    return text if len(text) <= limit else text[:limit] + "…"


def _is_busy(e: sqlite3.OperationalError) -> bool:
    name = getattr(e, "sqlite_errorname", "")
    return name in ("SQLITE_BUSY", "SQLITE_LOCKED") or "locked" in str(e).lower()
