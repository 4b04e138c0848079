"""SlotTableModel: KV cache use per slot (sequence), from the engine's memory report."""

from __future__ import annotations

from PySide6.QtCore import Qt

from ..dto import MemoryFigures
from ..format import human_bytes
from .table_base import ColumnTableModel

COLUMNS = ("Slot", "KV in use", "Share of slot")


class SlotTableModel(ColumnTableModel):
    COLUMNS = COLUMNS

    def __init__(self, parent=None):
        super().__init__(parent)
        self._used: tuple[int, ...] = ()
        self._per_slot_bytes = 0

    def _n_rows(self) -> int:
        return len(self._used)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._used):
            return None
        used, col = self._used[index.row()], index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            share = f"{100 * used / self._per_slot_bytes:.1f} %" if self._per_slot_bytes else "–"
            return (str(index.row()), human_bytes(used), share)[col]
        if role == Qt.ItemDataRole.TextAlignmentRole and col > 0:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def set_figures(self, fig: MemoryFigures) -> None:
        used = tuple(fig.kv_per_seq_used)
        # what one slot may fill: with a unified cache (llama-server's default) the whole pool
        per_slot = fig.kv_seq_capacity_bytes or fig.kv_bytes // max(len(used), 1)
        if len(used) != len(self._used):
            self.beginResetModel()
            self._used, self._per_slot_bytes = used, per_slot
            self.endResetModel()
        elif used != self._used or per_slot != self._per_slot_bytes:
            self._used, self._per_slot_bytes = used, per_slot
            self.dataChanged.emit(self.index(0, 0), self.index(len(used) - 1, len(COLUMNS) - 1))
