"""ColumnTableModel: the row/column counts and horizontal headers every table model shares."""

from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt


class ColumnTableModel(QAbstractTableModel):
    """Subclasses set COLUMNS and implement `_n_rows()` and `data()`."""

    COLUMNS: tuple[str, ...] = ()

    def _n_rows(self) -> int:
        raise NotImplementedError

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else self._n_rows()

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):  # noqa: N802
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return self.COLUMNS[section] if 0 <= section < len(self.COLUMNS) else None
        return None
