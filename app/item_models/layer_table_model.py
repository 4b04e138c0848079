"""LayerTableModel: every tensor of the loaded LLM with its layer, type, shape and bytes."""

from __future__ import annotations

from PySide6.QtCore import Qt

from ..dto import TensorRow
from ..format import human_bytes
from .table_base import ColumnTableModel

COLUMNS = ("Layer", "Tensor", "Type", "Shape", "Bytes")
SORT_ROLE = Qt.ItemDataRole.UserRole + 1


class LayerTableModel(ColumnTableModel):
    COLUMNS = COLUMNS

    def __init__(self, parent=None):
        super().__init__(parent)
        self._rows: list[TensorRow] = []

    def _n_rows(self) -> int:
        return len(self._rows)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        r, col = self._rows[index.row()], index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            layer = "–" if r.layer < 0 else str(r.layer)
            shape = " × ".join(str(d) for d in r.shape)
            return (layer, r.name, r.qtype, shape, human_bytes(r.nbytes))[col]
        if role == SORT_ROLE:
            return (r.layer, r.name, r.qtype, r.shape[0] if r.shape else 0, r.nbytes)[col]
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (0, 4):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{r.name}: {r.nbytes:,} bytes"
        return None

    def set_rows(self, rows: list[TensorRow]) -> None:
        self.beginResetModel()
        self._rows = list(rows)
        self.endResetModel()

    def total_bytes(self) -> int:
        return sum(r.nbytes for r in self._rows)

    def n_layers(self) -> int:
        return len({r.layer for r in self._rows if r.layer >= 0})
