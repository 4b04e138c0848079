"""StarterListModel: the starter models that can be pulled, and whether each is already cached."""

from __future__ import annotations

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt

from ..dto import StarterModel
from ..format import human_bytes

STARTER_ROLE = Qt.ItemDataRole.UserRole + 1


class StarterListModel(QAbstractListModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self._rows: list[StarterModel] = []

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        s = self._rows[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            size = f" · {human_bytes(s.size_bytes)}" if s.size_bytes else ""
            state = "downloaded" if s.cached_path else "not downloaded"
            return f"{s.name}{size} · {state}"
        if role == Qt.ItemDataRole.ToolTipRole:
            return s.description or s.name
        if role == STARTER_ROLE:
            return s
        return None

    def set_starters(self, rows: list[StarterModel]) -> None:
        self.beginResetModel()
        self._rows = list(rows)
        self.endResetModel()

    def starter(self, row: int) -> StarterModel:
        return self._rows[row]
