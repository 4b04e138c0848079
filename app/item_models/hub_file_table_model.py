"""HubFileTableModel: one repository's GGUF model files, with what the engine says of each.

The fit (supported here? fits in free RAM?) is known only once the file's header has been read
(HubApi.fit), which the panel asks for lazily; until then a row says it is not checked.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QIcon, QPainter, QPixmap

from ..dto import FIT_NO, FIT_OK, FIT_TIGHT, HubFileInfo, HubFitInfo
from ..format import human_bytes
from .table_base import ColumnTableModel

FILE_ROLE = Qt.ItemDataRole.UserRole + 1
SORT_ROLE = Qt.ItemDataRole.UserRole + 2
FIT_ROLE = Qt.ItemDataRole.UserRole + 3  # HubFitInfo, or None

GREEN, AMBER, RED = QColor("#3fa34d"), QColor("#d39a1c"), QColor("#d9534f")
FIT_COLOURS = {FIT_OK: GREEN, FIT_TIGHT: AMBER, FIT_NO: RED}
FIT_WORDS = {FIT_OK: "fits", FIT_TIGHT: "tight", FIT_NO: "too big"}
COL_QUANT, COL_SIZE, COL_ENGINE, COL_FIT, COL_FILE = range(5)

_dots: dict[str, QIcon] = {}


def dot_icon(colour: QColor, size: int = 12) -> QIcon:
    """A filled circle: the traffic light of a fit verdict."""
    if colour.name() not in _dots:
        pix = QPixmap(size, size)
        pix.fill(Qt.GlobalColor.transparent)
        p = QPainter(pix)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(colour)
        p.drawEllipse(1, 1, size - 2, size - 2)
        p.end()
        _dots[colour.name()] = QIcon(pix)
    return _dots[colour.name()]


def size_text(f: HubFileInfo) -> str:
    if f.size_bytes is None:
        return "?"
    parts = f" ({f.n_parts} parts)" if f.n_parts > 1 else ""
    return human_bytes(f.size_bytes) + parts


class HubFileTableModel(ColumnTableModel):
    COLUMNS = ("Quant", "Size", "Engine", "Fit", "File")

    def __init__(self, parent=None):
        super().__init__(parent)
        self.repo_id = ""
        self._rows: list[HubFileInfo] = []
        self._fits: dict[str, HubFitInfo] = {}  # filename -> fit
        self._errors: dict[str, str] = {}  # filename -> why the fit could not be read
        self._checking: set[str] = set()

    def _n_rows(self) -> int:
        return len(self._rows)

    # data -------------------------------------------------------------------------------------
    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        f, col = self._rows[index.row()], index.column()
        fit = self._fits.get(f.filename)
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text(f, col, fit)
        if (
            role == Qt.ItemDataRole.DecorationRole
            and col == COL_FIT
            and fit is not None
            and fit.supported
        ):
            return dot_icon(FIT_COLOURS[fit.verdict])
        if role == Qt.ItemDataRole.ForegroundRole and col == COL_ENGINE:
            if (fit is not None and not fit.supported) or f.filename in self._errors:
                return RED
            return None
        if role == Qt.ItemDataRole.FontRole and col == COL_QUANT and f.default:
            font = QFont()
            font.setBold(True)
            return font
        if role == Qt.ItemDataRole.TextAlignmentRole and col == COL_SIZE:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(f, fit)
        if role == SORT_ROLE:
            return (
                f.quant,
                f.size_bytes or 0,
                int(fit.supported) if fit else -1,
                fit.needed_bytes if fit else 0,
                f.filename,
            )[col]
        if role == FILE_ROLE:
            return f
        if role == FIT_ROLE:
            return fit
        return None

    def _text(self, f: HubFileInfo, col: int, fit: HubFitInfo | None) -> str:
        if col == COL_QUANT:
            return f.quant or "–"
        if col == COL_SIZE:
            return size_text(f)
        if col == COL_FILE:
            name = f"{f.filename}  + {f.mmproj}" if f.mmproj else f.filename
            return f"{name}  · downloaded" if f.local_path else name
        if f.filename in self._checking:
            return "checking…"
        if f.filename in self._errors:
            return "✗ unknown" if col == COL_ENGINE else "–"
        if fit is None:
            return "not checked" if col == COL_ENGINE else ""
        if col == COL_ENGINE:
            return f"✓ {fit.arch}" if fit.supported else "✗ not supported"
        if not fit.supported:
            return "–"
        return f"{FIT_WORDS[fit.verdict]} · {human_bytes(fit.needed_bytes)}"

    def _tooltip(self, f: HubFileInfo, fit: HubFitInfo | None) -> str:
        lines = [f.filename]
        if f.default:
            lines.append("The file `-hf` picks when no quant is given.")
        if f.mmproj:
            size = f" ({human_bytes(f.mmproj_bytes)})" if f.mmproj_bytes else ""
            lines.append(f"Reads images: its projector {f.mmproj}{size} downloads with it.")
        if f.local_path:
            lines.append(f"Downloaded: {f.local_path}")
        if f.filename in self._errors:
            lines.append(f"The header could not be read: {self._errors[f.filename]}")
        elif fit is None:
            lines.append("Select the file to read its header (a few MB) and check it.")
        elif not fit.supported:
            lines.append(f"Not supported by this engine: {fit.why_unsupported}")
        else:
            lines.append(
                f"Needs about {human_bytes(fit.needed_bytes)} at {fit.n_ctx:,} tokens of context; "
                f"{human_bytes(fit.available_bytes)} of RAM is available."
            )
        return "\n".join(lines)

    # updates ----------------------------------------------------------------------------------
    def set_files(self, repo_id: str, rows: list[HubFileInfo]) -> None:
        self.beginResetModel()
        self.repo_id = repo_id
        self._rows = list(rows)
        self._fits.clear()
        self._errors.clear()
        self._checking.clear()
        self.endResetModel()

    def clear(self) -> None:
        self.set_files("", [])

    def file(self, row: int) -> HubFileInfo:
        return self._rows[row]

    def fit(self, filename: str) -> HubFitInfo | None:
        return self._fits.get(filename)

    def fit_error(self, filename: str) -> str | None:
        return self._errors.get(filename)

    def row_of(self, filename: str) -> int:
        return next((i for i, f in enumerate(self._rows) if f.filename == filename), -1)

    def needs_check(self, filename: str) -> bool:
        return (
            filename not in self._fits
            and filename not in self._checking
            and filename not in self._errors
        )

    def set_checking(self, filename: str) -> None:
        self._checking.add(filename)
        self._errors.pop(filename, None)
        self._changed(filename)

    def set_fit(self, repo_id: str, fit: HubFitInfo) -> None:
        """A fit that arrives for another repository than the one shown is dropped."""
        if repo_id != self.repo_id:
            return
        self._checking.discard(fit.filename)
        self._fits[fit.filename] = fit
        self._changed(fit.filename)

    def set_fit_error(self, repo_id: str, filename: str, message: str) -> None:
        if repo_id != self.repo_id:
            return
        self._checking.discard(filename)
        self._errors[filename] = message
        self._changed(filename)

    def set_local_path(self, repo_id: str, filename: str, path: str | None) -> None:
        row = self.row_of(filename)
        if repo_id == self.repo_id and row >= 0:
            self._rows[row] = replace(self._rows[row], local_path=path)
            self._changed(filename)

    def _changed(self, filename: str) -> None:
        row = self.row_of(filename)
        if row >= 0:
            self.dataChanged.emit(self.index(row, 0), self.index(row, len(self.COLUMNS) - 1))
