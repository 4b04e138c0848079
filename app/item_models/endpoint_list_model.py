"""EndpointListModel: the remote servers the user added, with what connecting to each found."""

from __future__ import annotations

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt

from ..dto import EndpointInfo

ENDPOINT_ROLE = Qt.ItemDataRole.UserRole + 1


class EndpointListModel(QAbstractListModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self._rows: list[EndpointInfo] = []
        self._status: dict[str, str] = {}  # url -> "ggstation · 2 models", "unreachable", ...

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        e = self._rows[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            status = self._status.get(e.url, "")
            return f"{e.label}\n{status}" if status else e.label
        if role == Qt.ItemDataRole.ToolTipRole:
            return e.url
        if role == ENDPOINT_ROLE:
            return e
        return None

    def endpoints(self) -> list[EndpointInfo]:
        return list(self._rows)

    def endpoint(self, row: int) -> EndpointInfo:
        return self._rows[row]

    def row_of(self, url: str) -> int:
        return next((i for i, e in enumerate(self._rows) if e.url == url), -1)

    def set_endpoints(self, endpoints: list[EndpointInfo]) -> None:
        self.beginResetModel()
        self._rows = list(endpoints)
        self.endResetModel()

    def add_or_replace(self, endpoint: EndpointInfo, old_url: str = "") -> int:
        """Adds `endpoint`, or replaces the row of `old_url` (an edit); returns its row."""
        row = self.row_of(old_url or endpoint.url)
        if row < 0:
            row = len(self._rows)
            self.beginInsertRows(QModelIndex(), row, row)
            self._rows.append(endpoint)
            self.endInsertRows()
        else:
            self._rows[row] = endpoint
            self.dataChanged.emit(self.index(row), self.index(row))
        return row

    def remove(self, row: int) -> None:
        self.beginRemoveRows(QModelIndex(), row, row)
        e = self._rows.pop(row)
        self.endRemoveRows()
        self._status.pop(e.url, None)

    def set_status(self, url: str, status: str) -> None:
        self._status[url] = status
        row = self.row_of(url)
        if row >= 0:
            self.dataChanged.emit(self.index(row), self.index(row))
