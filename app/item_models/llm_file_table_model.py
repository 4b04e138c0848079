"""LlmFileTableModel: GGUF files found on disk with what they are; unusable files keep their reason."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, Qt
from PySide6.QtGui import QColor

from ..dto import LlmFileInfo
from ..format import human_bytes, human_count
from .table_base import ColumnTableModel

COLUMNS = ("Name", "Arch", "Params", "Quant", "Size", "Train ctx", "Template", "Status")
INFO_ROLE = Qt.ItemDataRole.UserRole + 1
SORT_ROLE = Qt.ItemDataRole.UserRole + 2


class LlmFileTableModel(ColumnTableModel):
    COLUMNS = COLUMNS

    def __init__(self, parent=None):
        super().__init__(parent)
        self._rows: list[LlmFileInfo] = []

    def _n_rows(self) -> int:
        return len(self._rows)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        info, col = self._rows[index.row()], index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text(info, col)
        if role == SORT_ROLE:
            return (
                info.name,
                info.arch,
                info.n_params,
                info.main_quant,
                info.file_size,
                info.n_ctx_train,
                int(info.has_chat_template),
                info.error or "",
            )[col]
        if role == Qt.ItemDataRole.ToolTipRole:
            if col == 6 and info.template_name:
                return f"chat template: {info.template_name}"
            if col == 1 and info.mmproj_note:
                return info.mmproj_note
            return info.error or self._quant_tooltip(info) or info.path
        if role == Qt.ItemDataRole.ForegroundRole and info.error and col == 7:
            return QColor("#d9534f")
        if role == INFO_ROLE:
            return info
        return None

    @staticmethod
    def _text(info: LlmFileInfo, col: int) -> str:
        if info.error and col not in (0, 4, 7):
            return "–"
        return (
            info.name,
            f"{info.arch} + vision" if info.vision else info.arch,
            human_count(info.n_params),
            info.main_quant,
            human_bytes(info.file_size),
            f"{info.n_ctx_train:,}",
            _template_text(info),
            _short(f"✗ {info.error.splitlines()[0]}") if info.error else "ready",
        )[col]

    @staticmethod
    def _quant_tooltip(info: LlmFileInfo) -> str:
        total = sum(info.quant_mix.values()) or 1
        mix = ", ".join(
            f"{k} {100 * v / total:.0f}%"
            for k, v in sorted(info.quant_mix.items(), key=lambda kv: -kv[1])
        )
        title = f"{info.title}\n" if info.title else ""
        return f"{title}{info.path}\n{mix}"

    def add_or_update(self, info: LlmFileInfo) -> int:
        for row, old in enumerate(self._rows):
            if old.path == info.path:
                self._rows[row] = info
                self.dataChanged.emit(self.index(row, 0), self.index(row, len(COLUMNS) - 1))
                return row
        row = len(self._rows)
        self.beginInsertRows(QModelIndex(), row, row)
        self._rows.append(info)
        self.endInsertRows()
        return row

    def info(self, row: int) -> LlmFileInfo:
        return self._rows[row]

    def row_of(self, path: str) -> int:
        return next((i for i, r in enumerate(self._rows) if r.path == path), -1)


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _template_text(info: LlmFileInfo) -> str:
    """'yes' (the GGUF's own), 'built-in' (a fallback the engine picked for the arch) or 'none'."""
    if info.has_chat_template:
        return "yes"
    return "built-in" if info.template_name else "none"
