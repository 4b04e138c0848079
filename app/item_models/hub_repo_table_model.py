"""HubRepoTableModel: the GGUF repositories a Hub search found."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, Qt

from ..dto import HubRepoInfo
from ..format import human_count
from .table_base import ColumnTableModel

REPO_ROLE = Qt.ItemDataRole.UserRole + 1
SORT_ROLE = Qt.ItemDataRole.UserRole + 2


class HubRepoTableModel(ColumnTableModel):
    COLUMNS = ("Repository", "Downloads", "Likes")

    def __init__(self, parent=None):
        super().__init__(parent)
        self._rows: list[HubRepoInfo] = []

    def _n_rows(self) -> int:
        return len(self._rows)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        r, col = self._rows[index.row()], index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            name = r.repo_id + ("  · vision" if r.vision else "") + ("  · gated" if r.gated else "")
            return (name, human_count(r.downloads), human_count(r.likes))[col]
        if role == SORT_ROLE:
            return (r.repo_id.lower(), r.downloads, r.likes)[col]
        if role == Qt.ItemDataRole.TextAlignmentRole and col > 0:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ToolTipRole:
            gated = (
                "\nGated: accept its terms on the Hub and use a token to download."
                if r.gated
                else ""
            )
            vision = (
                "\nVision: it has a projector (mmproj) that downloads with its models."
                if r.vision
                else ""
            )
            return (
                f"{r.repo_id}\n{r.n_files} GGUF model file(s) · {r.downloads:,} downloads · "
                f"{r.likes:,} likes{vision}{gated}"
            )
        if role == REPO_ROLE:
            return r
        return None

    def set_repos(self, rows: list[HubRepoInfo]) -> None:
        self.beginResetModel()
        self._rows = list(rows)
        self.endResetModel()

    def repo(self, row: int) -> HubRepoInfo:
        return self._rows[row]

    def row_of(self, repo_id: str) -> int:
        return next((i for i, r in enumerate(self._rows) if r.repo_id == repo_id), -1)

    def clear(self) -> None:
        self.set_repos([])

    def index_of(self, repo_id: str) -> QModelIndex:
        row = self.row_of(repo_id)
        return self.index(row, 0) if row >= 0 else QModelIndex()
