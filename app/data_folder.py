"""Open the data folder's history and settings, or recover, so that the app always starts.

A damaged file is renamed aside with a timestamp (never deleted: it may still hold the user's
chats) and a fresh one is started; a folder the app cannot write gives an in-memory store
holding a copy of whatever history is readable. Each problem becomes one plain sentence that
the window shows.
"""

from __future__ import annotations

import errno
import logging
import shutil
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QSettings

from .settings import read_settings
from .storage import ConversationStore

log = logging.getLogger(__name__)

STORE_ERRORS = (
    sqlite3.Error,
    OSError,
)  # what a store call or a file write raises when the disk misbehaves
_DAMAGED = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}


class DamagedStoreError(sqlite3.DatabaseError):
    """sqlite's integrity check found damage the first queries did not trip over."""


@dataclass
class DataFolder:
    store: ConversationStore
    settings: QSettings
    notices: list[str] = field(default_factory=list)  # what the window must tell the user


def open_data_folder(base: Path, qsettings: QSettings | None = None) -> DataFolder:
    """The history in `base` and the settings (`base`/settings.ini unless `qsettings` is given)."""
    store, store_notice = open_store(base / "conversations.sqlite3")
    qsettings = qsettings or QSettings(str(base / "settings.ini"), QSettings.Format.IniFormat)
    settings, settings_notice = open_settings(qsettings)
    return DataFolder(store, settings, [n for n in (store_notice, settings_notice) if n])


def describe_storage_error(e: BaseException) -> str:
    """The cause of a failed read or write, in words a user can act on."""
    name = getattr(e, "sqlite_errorname", "")
    text = str(e).lower()
    if name == "SQLITE_FULL" or "disk is full" in text or getattr(e, "errno", None) == errno.ENOSPC:
        return "the disk is full"
    if (
        name == "SQLITE_READONLY"
        or "readonly" in text
        or getattr(e, "errno", None) in (errno.EROFS, errno.EACCES)
    ):
        return "the data folder or the history file is read-only"
    if name in ("SQLITE_BUSY", "SQLITE_LOCKED") or "locked" in text:
        return "another program is using the history file"
    if name in _DAMAGED or isinstance(e, DamagedStoreError):
        return "the history file is damaged"
    if name == "SQLITE_CANTOPEN":
        return "the history file cannot be created or opened there"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return str(e) or type(e).__name__


# history ----------------------------------------------------------------------------------------
def open_store(path: Path) -> tuple[ConversationStore, str]:
    """The store at `path` and '' when all is well, else a usable store and what went wrong."""
    try:
        return _open_checked(path), ""
    except STORE_ERRORS as e:
        error: BaseException = e
    log.warning("history %s cannot be used: %s", path, error)
    if _is_damaged(path, error):
        try:
            aside = set_aside(path)
        except OSError as e:
            return _in_memory(
                path,
                f"the history file is damaged and could not be moved aside ({e.strerror or e})",
                copy=False,
            )
        try:
            store = _open_checked(path)
        except STORE_ERRORS as e:
            return _in_memory(path, describe_storage_error(e))
        return store, (
            f"Your conversation history could not be read ({describe_storage_error(error)}). "
            f"It was kept as {aside.name} in {aside.parent}, and a new, empty history was started."
        )
    return _in_memory(path, describe_storage_error(error))


def _open_checked(path: Path) -> ConversationStore:
    store = ConversationStore(path)
    problem = store.quick_check()  # a truncated file can open and fail only at the first read
    if problem:
        store.close()
        raise DamagedStoreError(problem)
    return store


def _is_damaged(path: Path, e: BaseException) -> bool:
    # Only damage justifies moving a file: a locked or read-only history is the user's, intact.
    return (
        path.is_dir()
        or isinstance(e, DamagedStoreError)
        or getattr(e, "sqlite_errorname", "") in _DAMAGED
    )


def _in_memory(path: Path, reason: str, copy: bool = True) -> tuple[ConversationStore, str]:
    store = (
        ConversationStore.read_only_copy(path)
        if copy and path.is_file()
        else ConversationStore(":memory:")
    )
    return store, (
        f"Conversation history will not be saved: {reason} ({path.parent}). "
        "Chats still work, and last until you quit."
    )


def set_aside(path: Path) -> Path:
    """Rename `path` (and sqlite's -wal/-shm/-journal beside it) to `<name>.corrupt-<time>`."""
    aside = _aside_name(path)
    path.rename(aside)
    for suffix in ("-wal", "-shm", "-journal"):
        # `<aside>-wal`, not `<name>-wal.corrupt-…`: sqlite opening the kept copy finds its log
        sibling = path.with_name(path.name + suffix)
        if sibling.exists():
            sibling.rename(aside.with_name(aside.name + suffix))
    log.warning("set %s aside as %s", path, aside)
    return aside


def _aside_name(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = path.with_name(f"{path.name}.corrupt-{stamp}"), 1
    while aside.exists():  # twice in one second: never overwrite an earlier kept copy
        aside, n = path.with_name(f"{path.name}.corrupt-{stamp}-{n}"), n + 1
    return aside


# settings ---------------------------------------------------------------------------------------
def open_settings(qs: QSettings) -> tuple[QSettings, str]:
    """`qs`, or a fresh one in its place when its file is damaged, and what the user must know."""
    path = Path(qs.fileName())
    # Native settings are an INI file on Linux only (the registry on Windows, a plist on macOS).
    is_ini = qs.format() == QSettings.Format.IniFormat or sys.platform not in ("win32", "darwin")
    if is_ini and (path.is_dir() or _garbled(path)):
        try:
            aside = set_aside(path)
        except OSError as e:
            return qs, f"Settings could not be read, and will not be saved ({e.strerror or e})."
        return (
            QSettings(str(path), qs.format()),
            f"Settings could not be read and were reset. The old file was kept as {aside.name}.",
        )
    _, bad = read_settings(qs)
    if bad:
        aside = _copy_aside(path) if is_ini else None
        for key in bad:  # the good keys stay; the bad ones are not reported again
            qs.remove(key)
        kept = f" The old file was kept as {aside.name}." if aside else ""
        return qs, f"Some settings could not be read ({', '.join(bad)}) and were reset.{kept}"
    if not qs.isWritable():
        return qs, f"Settings will not be saved: {path} cannot be written."
    return qs, ""


def _garbled(path: Path) -> bool:
    # QSettings reads any bytes as keys and only says FormatError when it next writes, which it
    # then refuses to do; Qt writes INI files as UTF-8 text, so anything else is damage.
    try:
        data = path.read_bytes()
    except OSError:  # missing (a first start) or unreadable: nothing to set aside
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return b"\0" in data


def _copy_aside(path: Path) -> Path | None:
    try:
        aside = _aside_name(path)
        shutil.copy2(path, aside)
        return aside
    except OSError:
        return None
