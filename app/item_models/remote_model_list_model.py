"""RemoteModelListModel: the models one remote server lists (GET /v1/models)."""

from __future__ import annotations

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt

from ..dto import RemoteModelInfo

MODEL_ID_ROLE = Qt.ItemDataRole.UserRole + 1


class RemoteModelListModel(QAbstractListModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self._rows: tuple[RemoteModelInfo, ...] = ()

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        m = self._rows[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return f"{m.id}   ·   context {m.n_ctx:,}" if m.n_ctx else m.id
        if role in (Qt.ItemDataRole.ToolTipRole, MODEL_ID_ROLE):
            return m.id
        return None

    def set_models(self, models: tuple[RemoteModelInfo, ...]) -> None:
        self.beginResetModel()
        self._rows = tuple(models)
        self.endResetModel()

    def ids(self) -> list[str]:
        return [m.id for m in self._rows]
