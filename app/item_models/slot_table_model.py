"""SlotTableModel: the slots of the server the chat talks to: KV cache use per sequence from
the engine's memory report, or a remote server's GET /slots (tokens held per slot)."""

from __future__ import annotations

from PySide6.QtCore import Qt

from ..dto import MemoryFigures, RemoteSlotRow
from ..format import human_bytes
from .table_base import ColumnTableModel

COLUMNS = ("Slot", "KV in use", "Share of slot")


class SlotTableModel(ColumnTableModel):
    COLUMNS = COLUMNS

    def __init__(self, parent=None):
        super().__init__(parent)
        self._rows: list[tuple[str, str, str]] = []
        self._remote = False  # showing a remote server's slots: the local reports wait

    def _n_rows(self) -> int:
        return len(self._rows)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._rows[index.row()][col]
        if role == Qt.ItemDataRole.TextAlignmentRole and col > 0:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def set_figures(self, fig: MemoryFigures) -> None:
        if self._remote:
            return
        used = tuple(fig.kv_per_seq_used)
        # what one slot may fill: with a unified cache (llama-server's default) the whole pool
        per_slot = fig.kv_seq_capacity_bytes or fig.kv_bytes // max(len(used), 1)
        self._set_rows([(str(i), human_bytes(u), _share(u, per_slot)) for i, u in enumerate(used)])

    def set_remote_slots(self, slots: tuple[RemoteSlotRow, ...]) -> None:
        self._remote = True
        self._set_rows(
            [
                (
                    f"{s.id} · {'busy' if s.busy else 'idle'}",
                    f"{s.n_tokens:,} tokens",
                    _share(s.n_tokens, s.n_ctx),
                )
                for s in slots
            ]
        )

    def clear_remote(self) -> None:
        """Back to the local engine's slots, from its next memory report."""
        if self._remote:
            self._remote = False
            self._set_rows([])

    def _set_rows(self, rows: list[tuple[str, str, str]]) -> None:
        if len(rows) != len(self._rows):
            self.beginResetModel()
            self._rows = rows
            self.endResetModel()
        elif rows != self._rows:
            self._rows = rows
            self.dataChanged.emit(self.index(0, 0), self.index(len(rows) - 1, len(COLUMNS) - 1))


def _share(used: int, capacity: int) -> str:
    return f"{100 * used / capacity:.1f} %" if capacity else "–"
