"""StarterPanel: pull a starter model with progress and cancel; pulled files join the picker."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListView,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from ..context import AppContext
from ..format import human_bytes
from ..item_models.starter_list_model import StarterListModel
from ..workers import CallWorker, PullWorker


class StarterPanel(QWidget):
    pulled = Signal(str)  # path the user asked for (downloaded now or already cached)
    found = Signal(str)  # path of a starter already in the cache, reported at start-up

    def __init__(self, ctx: AppContext, parent=None):
        super().__init__(parent)
        self.ctx = ctx
        self.starters = StarterListModel(self)
        self._worker: PullWorker | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.list = QListView()
        self.list.setModel(self.starters)
        self.list.setMaximumHeight(self.fontMetrics().height() * 5 + 12)
        self.list.doubleClicked.connect(lambda _i: self.pull_selected())
        self.list.selectionModel().currentChanged.connect(lambda *_: self._update_button())
        layout.addWidget(self.list)
        layout.addLayout(self._build_controls())
        self.refresh()

    def _build_controls(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.pull_button = QPushButton("Download", clicked=self.pull_selected)
        self.cancel_button = QPushButton("Cancel", clicked=self.cancel)
        self.progress = QProgressBar(maximum=1000)
        self.status = QLabel("", objectName="dim")
        self.cancel_button.hide()
        self.progress.hide()
        row.addWidget(self.pull_button)
        row.addWidget(self.cancel_button)
        row.addWidget(self.progress, 1)
        row.addWidget(self.status, 1)
        return row

    def refresh(self) -> None:
        worker = CallWorker(self.ctx.engine.starter_models)
        worker.result.connect(self._on_starters)
        worker.failed.connect(lambda msg: self.status.setText("Starter models unavailable"))
        self.ctx.pool.start(worker)

    def _on_starters(self, rows) -> None:
        self.starters.set_starters(rows)
        if rows and not self.list.currentIndex().isValid():
            self.list.setCurrentIndex(self.starters.index(0))
        self._update_button()
        for s in rows:
            if s.cached_path:
                self.found.emit(s.cached_path)

    def _update_button(self) -> None:
        idx = self.list.currentIndex()
        cached = idx.isValid() and self.starters.starter(idx.row()).cached_path
        self.pull_button.setText("Select in list" if cached else "Download")

    def pull_selected(self) -> None:
        idx = self.list.currentIndex()
        if not idx.isValid() or self._worker is not None:
            return
        starter = self.starters.starter(idx.row())
        if starter.cached_path:
            self.pulled.emit(starter.cached_path)
            return
        self._worker = PullWorker(self.ctx.engine, starter.name)
        self._worker.progressed.connect(self._on_progress)
        self._worker.pulled.connect(self.pulled)
        self._worker.failed.connect(lambda msg: self.status.setText(msg.splitlines()[0]))
        self._worker.cancelled.connect(lambda: self.status.setText("Download cancelled"))
        self._worker.finished.connect(self._on_finished)
        self.ctx.pool.start(self._worker)
        self._set_running(True)

    def cancel(self) -> None:
        if self._worker is not None:
            self._worker.cancel()

    def _on_progress(self, phase: str, done: int, total: int) -> None:
        self.progress.setValue(int(1000 * done / total) if total else 0)
        self.status.setText(
            f"{phase} {human_bytes(done)} of {human_bytes(total)}" if total else phase
        )

    def _on_finished(self) -> None:
        self._worker = None
        self._set_running(False)
        self.refresh()

    def _set_running(self, running: bool) -> None:
        self.pull_button.setEnabled(not running)
        self.cancel_button.setVisible(running)
        self.progress.setVisible(running)
