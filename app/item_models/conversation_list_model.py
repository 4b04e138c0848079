"""ConversationListModel: the sidebar's conversations, newest first; titles are editable."""

from __future__ import annotations

import time

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt, Signal

from ..storage import Conversation

ID_ROLE = Qt.ItemDataRole.UserRole + 1


class ConversationListModel(QAbstractListModel):
    title_edited = Signal(int, str)  # conversation id, new title

    def __init__(self, parent=None):
        super().__init__(parent)
        self._rows: list[Conversation] = []

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        c = self._rows[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return c.title
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{c.title}\nlast message {time.strftime('%Y-%m-%d %H:%M', time.localtime(c.updated))}"
        if role == ID_ROLE:
            return c.id
        return None

    def flags(self, index):
        base = super().flags(index)
        return base | Qt.ItemFlag.ItemIsEditable if index.isValid() else base

    def setData(self, index, value, role=Qt.ItemDataRole.EditRole) -> bool:  # noqa: N802
        if not index.isValid() or role != Qt.ItemDataRole.EditRole or not str(value).strip():
            return False
        c = self._rows[index.row()]
        self._rows[index.row()] = Conversation(c.id, str(value).strip(), c.updated)
        self.dataChanged.emit(index, index)
        self.title_edited.emit(c.id, str(value).strip())
        return True

    def set_conversations(self, rows: list[Conversation]) -> None:
        self.beginResetModel()
        self._rows = list(rows)
        self.endResetModel()

    def row_of(self, conversation_id: int) -> int:
        return next((i for i, c in enumerate(self._rows) if c.id == conversation_id), -1)

    def title(self, conversation_id: int) -> str:
        row = self.row_of(conversation_id)
        return self._rows[row].title if row >= 0 else ""

    def conversation_id(self, row: int) -> int:
        return self._rows[row].id
