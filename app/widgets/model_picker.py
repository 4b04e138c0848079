"""ModelPicker: GGUF files (open, drop, recent, folder scan, the Hugging Face cache) with what
they are, starter models, the Discover panel (the Hub), remote servers' models, and the load
panel for the selected file."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSortFilterProxyModel, Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QMenu,
    QPushButton,
    QSplitter,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from ..context import AppContext
from ..item_models.llm_file_table_model import INFO_ROLE, SORT_ROLE, LlmFileTableModel
from ..workers import CallWorker, InspectWorker
from .discover_panel import DiscoverPanel
from .load_panel import LoadPanel
from .remote_panel import RemotePanel
from .starter_panel import StarterPanel


class ModelPicker(QWidget):
    load_started = Signal()

    def __init__(self, ctx: AppContext, parent=None):
        super().__init__(parent)
        self.ctx = ctx
        self.files = LlmFileTableModel(self)
        self._pending_select = ""
        self._load_when_inspected = ""  # a path to load as soon as its row is there
        self.setAcceptDrops(True)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(self._build_sources())
        self.load_panel = LoadPanel(ctx)
        self.load_panel.load_started.connect(self.load_started)
        splitter.addWidget(self.load_panel)
        self.sources.currentChanged.connect(self._on_source_changed)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 2)
        layout.addWidget(splitter)
        self.splitter = splitter
        self.add_paths(list(ctx.settings.recent_files))
        if ctx.settings.models_folder:
            self.add_paths([ctx.settings.models_folder])
        self._add_hub_cache()

    # building -------------------------------------------------------------------------------
    def _build_sources(self) -> QTabWidget:
        """Files on this computer, and the Hub's."""
        self.sources = QTabWidget(documentMode=True)
        self.sources.addTab(self._build_files(), "On this computer")
        discover = QWidget()
        col = QVBoxLayout(discover)
        col.setContentsMargins(12, 4, 6, 12)
        self.discover = DiscoverPanel(self.ctx)
        self.discover.model_downloaded.connect(self.open_path)
        self.discover.load_requested.connect(self.open_and_load)
        col.addWidget(self.discover)
        self.sources.addTab(discover, "Discover on Hugging Face")
        self.remote = RemotePanel(self.ctx)
        self.sources.addTab(self.remote, "Remote servers")
        if self.discover.downloads.model.rowCount():  # unfinished downloads of the last session
            self.sources.setCurrentWidget(discover)
        return self.sources

    def _build_files(self) -> QWidget:
        box = QWidget()
        col = QVBoxLayout(box)
        col.setContentsMargins(12, 12, 6, 12)
        col.addLayout(self._build_toolbar())
        col.addWidget(self._build_table(), 1)
        starters = QGroupBox("Starter models")
        self.starter_panel = StarterPanel(self.ctx)
        self.starter_panel.found.connect(lambda p: self.add_paths([p]))
        self.starter_panel.pulled.connect(self.open_path)
        QVBoxLayout(starters).addWidget(self.starter_panel)
        col.addWidget(starters)
        return box

    def _build_toolbar(self) -> QHBoxLayout:
        row = QHBoxLayout()
        open_button = QPushButton("Open file…", clicked=self.open_file)
        open_button.setToolTip("Open a .gguf file (Ctrl+O)")
        folder_button = QPushButton("Models folder…", clicked=self.choose_folder)
        self.recent_button = QPushButton("Recent")
        self.recent_menu = QMenu(self)
        self.recent_menu.aboutToShow.connect(self._fill_recent)
        self.recent_button.setMenu(self.recent_menu)
        for b in (open_button, folder_button, self.recent_button):
            row.addWidget(b)
        row.addStretch(1)
        return row

    def _build_table(self) -> QTableView:
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.files)
        self.proxy.setSortRole(SORT_ROLE)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.verticalHeader().hide()
        self.table.setShowGrid(False)
        self.table.setAlternatingRowColors(True)
        self.table.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QTableView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 10)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        self.table.setColumnWidth(0, self.fontMetrics().horizontalAdvance("M" * 14))
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.table.setWordWrap(False)
        self.table.selectionModel().currentRowChanged.connect(self._on_current_changed)
        self.table.doubleClicked.connect(lambda _i: self.load_panel.start_load())
        return self.table

    def _on_source_changed(self, _index: int) -> None:
        # the load panel loads files: beside remote servers it would only confuse
        self.load_panel.setVisible(self.sources.currentWidget() is not self.remote)

    # files ----------------------------------------------------------------------------------
    def add_paths(self, paths: list[str]) -> None:
        paths = [p for p in paths if p and Path(p).exists()]
        if not paths:
            return
        worker = InspectWorker(self.ctx.engine, paths)
        worker.file_inspected.connect(self._on_inspected)
        self.ctx.pool.start(worker)

    def _add_hub_cache(self) -> None:
        """The complete GGUFs in the Hugging Face cache join the list."""
        worker = CallWorker(self.ctx.engine.hub().cached_models)
        worker.result.connect(self._on_hub_cache)
        self.ctx.pool.start(worker)

    def _on_hub_cache(self, files) -> None:
        self.add_paths([f.local_path for f in files if f.local_path])

    def _on_inspected(self, info) -> None:
        row = self.files.add_or_update(info)
        if not self.table.currentIndex().isValid() or info.path == self._pending_select:
            self.select_path(info.path)
        elif self.load_panel.info and self.load_panel.info.path == info.path:
            self.load_panel.set_info(self.files.info(row))
        if info.path == self._load_when_inspected:
            self._load_when_inspected = ""
            self.select_path(info.path)
            self.load_panel.start_load()

    def open_and_load(self, path: str) -> None:
        """Inspect `path`, select it and load it with the load panel's settings."""
        self._load_when_inspected = path
        self.open_path(path)

    def open_path(self, path: str) -> None:
        """Inspect `path` and select it once its row appears."""
        self._pending_select = path
        self.add_paths([path])
        self.select_path(path)

    def select_path(self, path: str) -> None:
        row = self.files.row_of(path)
        if row >= 0:
            self.table.setCurrentIndex(self.proxy.mapFromSource(self.files.index(row, 0)))

    def _on_current_changed(self, current, _previous) -> None:
        if current.isValid():
            self.load_panel.set_info(current.data(INFO_ROLE))

    def open_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Open GGUF model",
            self.ctx.settings.models_folder,
            "GGUF models (*.gguf);;All files (*)",
        )
        if path:
            self.ctx.settings.add_recent(path)
            self.open_path(path)

    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self, "Models folder", self.ctx.settings.models_folder
        )
        if folder:
            self.ctx.settings.models_folder = folder
            self.add_paths([folder])

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        for path in self.ctx.settings.recent_files:
            self.recent_menu.addAction(
                Path(path).name, lambda p=path: (self.add_paths([p]), self.select_path(p))
            )
        if not self.ctx.settings.recent_files:
            self.recent_menu.addAction("No recent files").setEnabled(False)

    # drag and drop ----------------------------------------------------------------------------
    def dragEnterEvent(self, event) -> None:  # noqa: N802
        if any(u.toLocalFile().endswith(".gguf") for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802
        paths = [
            u.toLocalFile() for u in event.mimeData().urls() if u.toLocalFile().endswith(".gguf")
        ]
        for p in paths:
            self.ctx.settings.add_recent(p)
        self.add_paths(paths)
