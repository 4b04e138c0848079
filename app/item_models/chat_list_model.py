"""ChatListModel: the messages of one conversation; a streaming reply grows its last row."""

from __future__ import annotations

from typing import NamedTuple

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt

from ..storage import Message

ROLE_ROLE = Qt.ItemDataRole.UserRole + 1  # "user" | "assistant" | "system"
STATS_ROLE = Qt.ItemDataRole.UserRole + 2  # dict: speed, counts, replay record
STREAMING_ROLE = Qt.ItemDataRole.UserRole + 3  # bool: the reply is still growing
ID_ROLE = Qt.ItemDataRole.UserRole + 4  # storage message id
ERROR_ROLE = Qt.ItemDataRole.UserRole + 5  # str: why a reply failed


class RowView(NamedTuple):
    """Everything the chat delegate draws for one row, read in one call: it lays rows out
    several times per paint, and each data() call crosses into C++ and back."""

    text: str
    role: str
    stats: dict | None
    streaming: bool
    error: str
    is_last: bool
    images: tuple = ()  # ImageAttachment, in order
    phase: str = ""  # the streaming reply's "encoding image 1 of 2" before its first token


class ChatListModel(QAbstractListModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self._messages: list[Message] = []
        self._streaming_row = -1
        self._errors: dict[int, str] = {}
        self._phase = ""  # of the streaming row

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self._messages)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._messages):
            return None
        # called several times per row for every layout and paint: no per-call dict
        m = self._messages[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return m.content
        if role == ROLE_ROLE:
            return m.role
        if role == STREAMING_ROLE:
            return index.row() == self._streaming_row
        if role == ERROR_ROLE:
            return self._errors.get(index.row(), "")
        if role == STATS_ROLE:
            return m.stats
        if role == ID_ROLE:
            return m.id
        return None

    def roleNames(self):  # noqa: N802
        return {
            **super().roleNames(),
            ROLE_ROLE: b"role",
            STATS_ROLE: b"stats",
            STREAMING_ROLE: b"streaming",
            ID_ROLE: b"messageId",
            ERROR_ROLE: b"error",
        }

    # editing --------------------------------------------------------------------------------
    def set_messages(self, messages: list[Message]) -> None:
        self.beginResetModel()
        self._messages, self._streaming_row, self._errors = list(messages), -1, {}
        self._phase = ""
        self.endResetModel()

    def append(self, message: Message, streaming: bool = False) -> int:
        row = len(self._messages)
        self.beginInsertRows(QModelIndex(), row, row)
        self._messages.append(message)
        if streaming:
            self._streaming_row = row
        self.endInsertRows()
        return row

    def append_delta(self, text: str) -> None:
        row = self._streaming_row
        if row < 0:
            return
        self._messages[row].content += text
        idx = self.index(row)
        self.dataChanged.emit(idx, idx, [Qt.ItemDataRole.DisplayRole])

    def set_phase(self, phase: str) -> None:
        """What the streaming reply is waiting on ('' once text comes)."""
        row = self._streaming_row
        if row < 0 or phase == self._phase:
            return
        self._phase = phase
        idx = self.index(row)
        self.dataChanged.emit(idx, idx, [Qt.ItemDataRole.DisplayRole])

    def finish_streaming(self, stats: dict | None = None, error: str = "") -> None:
        row, self._streaming_row = self._streaming_row, -1
        self._phase = ""
        if row < 0:
            return
        if stats is not None:
            self._messages[row].stats = stats
        if error:
            self._errors[row] = error
        idx = self.index(row)
        self.dataChanged.emit(idx, idx)

    def set_error(self, message: Message, error: str) -> None:
        """Show `error` under `message` (found by identity: rows move when the chat changes)."""
        row = next((i for i, m in enumerate(self._messages) if m is message), -1)
        if row >= 0:
            self._errors[row] = error
            idx = self.index(row)
            self.dataChanged.emit(idx, idx)

    def truncate(self, row: int) -> None:
        """Remove `row` and every row after it."""
        if row >= len(self._messages):
            return
        self.beginRemoveRows(QModelIndex(), row, len(self._messages) - 1)
        del self._messages[row:]
        self._errors = {r: e for r, e in self._errors.items() if r < row}
        if self._streaming_row >= row:
            self._streaming_row = -1
        self.endRemoveRows()

    # reading --------------------------------------------------------------------------------
    def row_view(self, row: int) -> RowView:
        m = self._messages[row]
        return RowView(
            m.content,
            m.role,
            m.stats,
            row == self._streaming_row,
            self._errors.get(row, ""),
            row == len(self._messages) - 1,
            tuple(m.images),
            self._phase if row == self._streaming_row else "",
        )

    def message(self, row: int) -> Message:
        return self._messages[row]

    def messages(self) -> list[Message]:
        return list(self._messages)

    def streaming_message(self) -> Message | None:
        return self._messages[self._streaming_row] if self._streaming_row >= 0 else None

    def is_streaming(self) -> bool:
        return self._streaming_row >= 0
