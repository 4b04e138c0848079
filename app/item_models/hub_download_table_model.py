"""HubDownloadTableModel: the Hub downloads of this session and the unfinished ones of earlier
sessions, with progress, speed and time left. app/hub_downloads.py changes the rows."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QModelIndex, Qt

from ..format import human_bytes
from .hub_file_table_model import RED
from .table_base import ColumnTableModel

DOWNLOAD_ROLE = Qt.ItemDataRole.UserRole + 1
FRACTION_ROLE = Qt.ItemDataRole.UserRole + 2  # 0..1, or -1 while the size is unknown

# Download.state
DOWNLOADING, PAUSING, PAUSED, CANCELLING, FAILED, DONE = (
    "downloading",
    "pausing",
    "paused",
    "cancelling",
    "failed",
    "done",
)
COL_MODEL, COL_PROGRESS, COL_SPEED, COL_ETA, COL_STATUS = range(5)


@dataclass
class Download:
    """One download, changed in place by the manager (then HubDownloadTableModel.changed())."""

    repo_id: str
    filename: str
    quant: str = ""
    total: int = 0  # bytes; 0 while unknown
    done: int = 0
    state: str = PAUSED
    rate: float = 0.0  # bytes per second, 0 while unknown
    message: str = ""  # why it failed
    path: str = ""  # the model, once done
    earlier: bool = False  # remembered from an earlier session

    @property
    def key(self) -> tuple[str, str]:
        return self.repo_id, self.filename

    @property
    def title(self) -> str:
        return f"{self.repo_id}:{self.quant}" if self.quant else f"{self.repo_id}/{self.filename}"

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else -1.0

    @property
    def active(self) -> bool:
        """A worker is running for it."""
        return self.state in (DOWNLOADING, PAUSING, CANCELLING)


def eta_text(seconds: float) -> str:
    s = int(seconds + 0.5)
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


class HubDownloadTableModel(ColumnTableModel):
    COLUMNS = ("Model", "Progress", "Speed", "Time left", "Status")

    def __init__(self, parent=None):
        super().__init__(parent)
        self._rows: list[Download] = []

    def _n_rows(self) -> int:
        return len(self._rows)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        d, col = self._rows[index.row()], index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text(d, col)
        if role == Qt.ItemDataRole.ToolTipRole:
            return "\n".join(x for x in (d.title, d.filename, d.path, d.message) if x)
        if role == Qt.ItemDataRole.ForegroundRole and col == COL_STATUS and d.state == FAILED:
            return RED
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (COL_SPEED, COL_ETA):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == DOWNLOAD_ROLE:
            return d
        if role == FRACTION_ROLE:
            return d.fraction
        return None

    @staticmethod
    def _text(d: Download, col: int) -> str:
        if col == COL_MODEL:
            return d.title
        if col == COL_PROGRESS:
            if not d.total:
                return human_bytes(d.done) if d.done else ""
            return f"{100 * d.fraction:.0f}% · {human_bytes(d.done)} of {human_bytes(d.total)}"
        downloading = d.state == DOWNLOADING and d.rate > 0
        if col == COL_SPEED:
            return f"{human_bytes(d.rate)}/s" if downloading else ""
        if col == COL_ETA:
            return eta_text((d.total - d.done) / d.rate) if downloading and d.total else ""
        if d.state == FAILED:
            return f"failed: {d.message.splitlines()[0]}" if d.message else "failed"
        if d.state == PAUSED and d.earlier:
            return "paused (last session)"
        return {PAUSING: "pausing…", CANCELLING: "cancelling…"}.get(d.state, d.state)

    # rows ---------------------------------------------------------------------------------
    def add(self, d: Download) -> int:
        row = len(self._rows)
        self.beginInsertRows(QModelIndex(), row, row)
        self._rows.append(d)
        self.endInsertRows()
        return row

    def remove(self, d: Download) -> None:
        row = self.row_of(d)
        if row >= 0:
            self.beginRemoveRows(QModelIndex(), row, row)
            del self._rows[row]
            self.endRemoveRows()

    def changed(self, d: Download) -> None:
        row = self.row_of(d)
        if row >= 0:
            self.dataChanged.emit(self.index(row, 0), self.index(row, len(self.COLUMNS) - 1))

    def row_of(self, d: Download) -> int:
        return next((i for i, r in enumerate(self._rows) if r is d), -1)

    def find(self, repo_id: str, filename: str) -> Download | None:
        return next((r for r in self._rows if r.key == (repo_id, filename)), None)

    def download(self, row: int) -> Download:
        return self._rows[row]

    def rows(self) -> list[Download]:
        return list(self._rows)
