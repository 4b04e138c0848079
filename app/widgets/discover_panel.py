"""DiscoverPanel: find GGUF models on the Hugging Face Hub, know whether each would run here before
downloading it, and download it into the Hugging Face cache with pause, resume and cancel.

Every Hub call runs on a worker (app/hub_workers.py). Each answer carries the number of the
request it answers; the panel keeps the number of the newest search and listing and drops the
others, so a slow answer to an older question never replaces a newer one. Fits are kept per
file of the repository shown. A token typed here stays in memory for this session only: to
keep one, set HF_TOKEN or run `hf auth login`, which the library reads by itself.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from PySide6.QtCore import QRectF, QSortFilterProxyModel, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QIcon, QPainter, QPalette
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QStyle,
    QStyledItemDelegate,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from ..context import AppContext
from ..dto import FIT_NO, HubFileInfo, HubFitInfo, HubRepoInfo
from ..errors import HubError
from ..format import human_bytes, human_count
from ..hub_downloads import DownloadManager
from ..hub_workers import HubCallWorker
from ..item_models.hub_download_table_model import (
    COL_PROGRESS,
    DONE,
    DOWNLOADING,
    FAILED,
    FRACTION_ROLE,
    PAUSED,
    Download,
)
from ..item_models.hub_file_table_model import (
    FILE_ROLE,
    FIT_COLOURS,
    FIT_WORDS,
    RED,
    HubFileTableModel,
    size_text,
)
from ..item_models.hub_file_table_model import SORT_ROLE as FILE_SORT_ROLE
from ..item_models.hub_repo_table_model import REPO_ROLE, HubRepoTableModel
from ..item_models.hub_repo_table_model import SORT_ROLE as REPO_SORT_ROLE

SEARCH_DELAY_MS = 400  # typing pauses this long before a search starts
TOKEN_HELP = (
    "This repository needs a Hugging Face token (it is gated or private). Set HF_TOKEN or "
    "run `hf auth login`, then restart; or paste a token here (kept for this session only)."
)


def _table(model, sort_role: int | None = None) -> QTableView:
    """A row-selecting table; sortable (through a proxy) when `sort_role` is given."""
    view = QTableView()
    if sort_role is None:
        view.setModel(model)
    else:
        proxy = QSortFilterProxyModel(model)
        proxy.setSourceModel(model)
        proxy.setSortRole(sort_role)
        view.setModel(proxy)
        view.setSortingEnabled(True)
        view.sortByColumn(
            -1, Qt.SortOrder.AscendingOrder
        )  # the Hub's order until a header is clicked
    view.verticalHeader().hide()
    view.setShowGrid(False)
    view.setAlternatingRowColors(True)
    view.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
    view.setSelectionMode(QTableView.SelectionMode.SingleSelection)
    view.setWordWrap(False)
    view.setTextElideMode(Qt.TextElideMode.ElideMiddle)
    view.verticalHeader().setDefaultSectionSize(view.fontMetrics().height() + 10)
    return view


def _fit_columns(view: QTableView, stretch: int) -> None:
    header = view.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(stretch, QHeaderView.ResizeMode.Stretch)
    header.setStretchLastSection(False)


class ProgressDelegate(QStyledItemDelegate):
    """The progress column: its text over a thin bar in the highlight colour."""

    def paint(self, painter: QPainter, option, index) -> None:
        super().paint(painter, option, index)
        fraction = index.data(FRACTION_ROLE)
        if fraction is None or fraction < 0:
            return
        r = QRectF(option.rect.adjusted(6, option.rect.height() - 6, -6, -3))
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        pal = option.palette
        track = pal.color(QPalette.ColorRole.Mid)
        chunk = pal.color(
            QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Highlight
        )
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(track)
        painter.drawRoundedRect(r, 1.5, 1.5)
        painter.setBrush(chunk)
        painter.drawRoundedRect(QRectF(r.x(), r.y(), r.width() * fraction, r.height()), 1.5, 1.5)
        painter.restore()


class DiscoverPanel(QWidget):
    model_downloaded = Signal(str)  # a download completed: the picker lists the file
    load_requested = Signal(str)  # the user asked to load a downloaded file

    def __init__(self, ctx: AppContext, parent=None):
        super().__init__(parent)
        self.ctx = ctx
        self.hub = ctx.engine.hub()
        self.token: str | None = None
        self.repos = HubRepoTableModel(self)
        self.files = HubFileTableModel(self)
        self.downloads = DownloadManager(
            ctx.pool, self.hub, ctx.qsettings, lambda: self.token, self
        )
        self._search_request = self._files_request = self._request = 0
        self._fit_requests: dict[int, tuple[str, str]] = {}  # request -> (repo_id, filename)
        self._retry: Callable[[], None] | None = None  # what a token should be tried on
        self._search_timer = QTimer(self, singleShot=True, interval=SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self.search)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 8, 0, 0)
        layout.setSpacing(6)
        layout.addLayout(self._build_search())
        layout.addWidget(self._build_token())
        self.splitter = QSplitter(Qt.Orientation.Vertical, childrenCollapsible=False)
        for part in (
            self._build_repos(),
            self._build_files(),
            self._build_detail(),
            self._build_downloads(),
        ):
            self.splitter.addWidget(part)
        for i, stretch in enumerate((3, 3, 0, 2)):
            self.splitter.setStretchFactor(i, stretch)
        layout.addWidget(self.splitter, 1)
        self.downloads.downloaded.connect(self._on_downloaded)
        self.downloads.failed.connect(self._on_download_failed)
        self.downloads.model.dataChanged.connect(self._on_downloads_changed)
        self.downloads.model.rowsInserted.connect(self._on_downloads_changed)
        self.downloads.model.rowsRemoved.connect(self._on_downloads_changed)
        self._show_file(None)
        self._on_downloads_changed()

    # building ---------------------------------------------------------------------------------
    def _build_search(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.query = QLineEdit(
            placeholderText="Search Hugging Face for GGUF models (qwen, llama 3, gemma…)",
            clearButtonEnabled=True,
        )
        self.query.textEdited.connect(lambda _t: self._search_timer.start())
        self.query.returnPressed.connect(self.search)
        self.search_button = QPushButton("Search", clicked=self.search)
        row.addWidget(self.query, 1)
        row.addWidget(self.search_button)
        return row

    def _build_token(self) -> QWidget:
        box = QWidget()
        col = QVBoxLayout(box)
        col.setContentsMargins(0, 0, 0, 0)
        self.error = QLabel(
            "",
            objectName="error",
            wordWrap=True,
            textInteractionFlags=Qt.TextInteractionFlag.TextSelectableByMouse,
        )
        self.token_row = QWidget()
        row = QHBoxLayout(self.token_row)
        row.setContentsMargins(0, 0, 0, 0)
        self.token_edit = QLineEdit(placeholderText="hf_…", echoMode=QLineEdit.EchoMode.Password)
        self.token_edit.returnPressed.connect(self.use_token)
        row.addWidget(QLabel("Token"))
        row.addWidget(self.token_edit, 1)
        row.addWidget(QPushButton("Use token", clicked=self.use_token))
        col.addWidget(self.error)
        col.addWidget(self.token_row)
        self.error.hide()
        self.token_row.hide()
        return box

    def _build_repos(self) -> QWidget:
        box = QWidget()
        col = QVBoxLayout(box)
        col.setContentsMargins(0, 0, 0, 0)
        self.repos_label = QLabel("Repositories", objectName="sectionTitle")
        self.repo_table = _table(self.repos, REPO_SORT_ROLE)
        _fit_columns(self.repo_table, 0)
        self.repo_table.selectionModel().currentRowChanged.connect(self._on_repo_changed)
        col.addWidget(self.repos_label)
        col.addWidget(self.repo_table, 1)
        return box

    def _build_files(self) -> QWidget:
        box = QWidget()
        col = QVBoxLayout(box)
        col.setContentsMargins(0, 0, 0, 0)
        self.files_label = QLabel("Files", objectName="sectionTitle")
        self.file_table = _table(self.files, FILE_SORT_ROLE)
        _fit_columns(self.file_table, 4)
        self.file_table.selectionModel().currentRowChanged.connect(self._on_file_changed)
        self.file_table.doubleClicked.connect(lambda _i: self.download_selected())
        col.addWidget(self.files_label)
        col.addWidget(self.file_table, 1)
        return box

    def _build_detail(self) -> QWidget:
        box = QWidget(objectName="hubDetail")
        box.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        col = QVBoxLayout(box)
        col.setContentsMargins(0, 4, 0, 4)
        self.detail_title = QLabel("", objectName="sectionTitle")
        self.fit_label = QLabel("", wordWrap=True, textFormat=Qt.TextFormat.RichText)
        row = QHBoxLayout()
        self.download_button = QPushButton(
            "Download", objectName="primary", clicked=self.download_selected
        )
        self.load_button = QPushButton("Load this model", clicked=self._load_selected)
        row.addWidget(self.download_button)
        row.addWidget(self.load_button)
        row.addStretch(1)
        col.addWidget(self.detail_title)
        col.addWidget(self.fit_label)
        col.addLayout(row)
        return box

    def _build_downloads(self) -> QWidget:
        box = QWidget()
        col = QVBoxLayout(box)
        col.setContentsMargins(0, 4, 0, 0)
        head = QHBoxLayout()
        head.addWidget(QLabel("Downloads", objectName="sectionTitle"))
        self.earlier_label = QLabel("", objectName="notice")
        self.resume_all_button = QPushButton("Resume all", clicked=self.resume_all)
        head.addWidget(self.earlier_label, 1)
        head.addWidget(self.resume_all_button)
        self.download_table = _table(self.downloads.model)
        self.download_table.setItemDelegateForColumn(
            COL_PROGRESS, ProgressDelegate(self.download_table)
        )
        self.download_table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 16)
        _fit_columns(self.download_table, 0)
        self.download_table.selectionModel().currentRowChanged.connect(
            lambda *_: self._update_download_buttons()
        )
        buttons = QHBoxLayout()
        self.pause_button = QPushButton("Pause", clicked=lambda: self._on_download_action("pause"))
        self.resume_button = QPushButton(
            "Resume", clicked=lambda: self._on_download_action("resume")
        )
        self.cancel_button = QPushButton(
            "Cancel", clicked=lambda: self._on_download_action("cancel")
        )
        self.open_button = QPushButton("Load", clicked=lambda: self._on_download_action("load"))
        for b in (self.pause_button, self.resume_button, self.cancel_button, self.open_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        col.addLayout(head)
        col.addWidget(self.download_table, 1)
        col.addLayout(buttons)
        return box

    # search -----------------------------------------------------------------------------------
    def search(self) -> None:
        self._search_timer.stop()
        text = self.query.text().strip()
        self._search_request = self._next_request()
        self.repos_label.setText(f"Searching for “{text}”…" if text else "Searching…")
        self._clear_error()
        self._call(
            self._search_request, self.hub.search, text, self.token, result=self._on_search_result
        )

    @Slot(int, object)
    def _on_search_result(self, request: int, repos: list[HubRepoInfo]) -> None:
        if request != self._search_request:
            return  # an older search: a newer one is under way or done
        text = self.query.text().strip()
        self.repos.set_repos(repos)
        self.repos_label.setText(
            f"Repositories ({len(repos)})" if repos else f"No GGUF repositories match “{text}”"
        )
        if repos:
            self.repo_table.setCurrentIndex(self.repo_table.model().index(0, 0))
        else:
            self.files.clear()
            self._show_file(None)

    # files ------------------------------------------------------------------------------------
    def _on_repo_changed(self, current, _previous) -> None:
        repo = current.data(REPO_ROLE) if current.isValid() else None
        if repo is not None and repo.repo_id != self.files.repo_id:
            self.list_files(repo.repo_id)

    def list_files(self, repo_id: str) -> None:
        self._files_request = self._next_request()
        self.files.set_files(repo_id, [])
        self.files_label.setText(f"Files in {repo_id}: listing…")
        self._clear_error()
        self._show_file(None)
        self._call(self._files_request, self.hub.files, repo_id, self.token, result=self._on_files)

    @Slot(int, object)
    def _on_files(self, request: int, files: list[HubFileInfo]) -> None:
        if request != self._files_request:
            return
        repo_id = self.files.repo_id
        self.files.set_files(repo_id, files)
        self.files_label.setText(
            f"Files in {repo_id}" if files else f"{repo_id} has no GGUF model files"
        )
        default = next((i for i, f in enumerate(files) if f.default), 0)
        if files:
            source = self.files.index(default, 0)
            self.file_table.setCurrentIndex(self.file_table.model().mapFromSource(source))

    def _on_file_changed(self, current, _previous) -> None:
        f = current.data(FILE_ROLE) if current.isValid() else None
        if f is not None and self.files.needs_check(f.filename):
            self.check_fit(f)
        self._show_file(f)

    def selected_file(self) -> HubFileInfo | None:
        idx = self.file_table.currentIndex()
        return idx.data(FILE_ROLE) if idx.isValid() else None

    # fit --------------------------------------------------------------------------------------
    def check_fit(self, f: HubFileInfo) -> None:
        request = self._next_request()
        self._fit_requests[request] = (f.repo_id, f.filename)
        self.files.set_checking(f.filename)
        self._call(request, self.hub.fit, f.repo_id, f.filename, self.token, result=self._on_fit)

    @Slot(int, object)
    def _on_fit(self, request: int, fit: HubFitInfo) -> None:
        repo_id, _filename = self._fit_requests.pop(request, ("", ""))
        self.files.set_fit(repo_id, fit)
        self._refresh_detail()

    # detail -----------------------------------------------------------------------------------
    def _refresh_detail(self) -> None:
        self._show_file(self.selected_file())

    def _show_file(self, f: HubFileInfo | None) -> None:
        self.detail_title.setVisible(f is not None)
        if f is None:
            self.fit_label.setText(
                "Search, pick a repository, then a file: its header is read (a few MB) "
                "to tell whether it runs here before you download it."
            )
            self.download_button.hide()
            self.load_button.hide()
            return
        self.detail_title.setText(f"{f.quant or 'File'} · {f.filename} · {size_text(f)}")
        self.fit_label.setToolTip(_projector_words(f))
        self.fit_label.setText(self._fit_html(f))
        self._update_download_button(f)

    def _fit_html(self, f: HubFileInfo) -> str:
        fit, error = self.files.fit(f.filename), self.files.fit_error(f.filename)
        if error:
            return f"<span style='color:{RED.name()}'>The header could not be read: {escape(error)}</span>"
        if fit is None:
            return "Reading the header to check it…"
        facts = (
            f"{escape(fit.arch)} · {human_count(fit.n_params)} parameters · trained on "
            f"{fit.n_ctx_train:,} tokens · {'chat template' if fit.has_chat_template else 'no chat template'}"
        )
        if f.mmproj:  # one line more would not show: the splitter gives the box its height
            size = f", {human_bytes(f.mmproj_bytes)}" if f.mmproj_bytes else ""
            facts += f" · reads images (+ {escape(f.mmproj)}{size})"
        if not fit.supported:
            return (
                f"{facts}<br><span style='color:{RED.name()}'><b>Not supported by this engine:</b> "
                f"{escape(fit.why_unsupported)}. It would not load here.</span>"
            )
        colour = FIT_COLOURS[fit.verdict].name()
        return (
            f"{facts}<br><span style='color:{colour}'>●</span> Needs about "
            f"<b>{human_bytes(fit.needed_bytes)}</b> at {fit.n_ctx:,} tokens of context; "
            f"{human_bytes(fit.available_bytes)} of RAM is available: "
            f"<b style='color:{colour}'>{FIT_WORDS[fit.verdict]}</b>."
        )

    def _update_download_button(self, f: HubFileInfo) -> None:
        d = self.downloads.model.find(f.repo_id, f.filename)
        fit = self.files.fit(f.filename)
        self.load_button.setVisible(bool(f.local_path))
        self.download_button.setVisible(not f.local_path)
        self.download_button.setEnabled(d is None or not d.active)
        size = f" ({human_bytes(f.download_bytes)})" if f.download_bytes else ""
        if d is not None and d.active:
            text, tip = "Downloading…", "See Downloads below."
        elif d is not None and d.state in (PAUSED, FAILED):
            text, tip = f"Resume download{size}", "Continues from the part already downloaded."
        elif fit is not None and not fit.supported:
            text, tip = (
                f"Download anyway{size}",
                f"This engine cannot run it: {fit.why_unsupported}.",
            )
        elif fit is not None and fit.verdict == FIT_NO:
            text, tip = f"Download anyway{size}", "It needs more memory than this machine has free."
        else:
            text, tip = (
                f"Download{size}",
                "Into the Hugging Face cache; pause and resume at any time.",
            )
        self.download_button.setText(text)
        self.download_button.setToolTip(tip)
        warn = text.startswith("Download anyway")
        self.download_button.setIcon(
            self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxWarning)
            if warn
            else QIcon()
        )
        if self.download_button.objectName() != (
            "" if warn else "primary"
        ):  # restyle: not a default action
            self.download_button.setObjectName("" if warn else "primary")
            self.download_button.style().unpolish(self.download_button)
            self.download_button.style().polish(self.download_button)

    # downloads --------------------------------------------------------------------------------
    def download_selected(self) -> None:
        f = self.selected_file()
        if f is None or f.local_path:
            return
        self._clear_error()
        d = self.downloads.start(f.repo_id, f.filename, f.quant, f.download_bytes or 0)
        self.download_table.setCurrentIndex(
            self.downloads.model.index(self.downloads.model.row_of(d), 0)
        )

    def _load_selected(self) -> None:
        f = self.selected_file()
        if f is not None and f.local_path:
            self.load_requested.emit(f.local_path)

    def resume_all(self) -> None:
        for d in self.downloads.model.rows():
            self.downloads.resume(d)

    def selected_download(self) -> Download | None:
        idx = self.download_table.currentIndex()
        return self.downloads.model.download(idx.row()) if idx.isValid() else None

    def _on_download_action(self, action: str) -> None:
        d = self.selected_download()
        if d is None:
            return
        if action == "load" and d.path:
            self.load_requested.emit(d.path)
        elif action in ("pause", "resume", "cancel"):
            getattr(self.downloads, action)(d)

    def _on_downloads_changed(self, *_args) -> None:
        rows = self.downloads.model.rows()
        earlier = [d for d in rows if d.earlier and d.state == PAUSED]
        self.earlier_label.setText(
            f"{len(earlier)} unfinished from the last session" if earlier else ""
        )
        self.resume_all_button.setVisible(any(d.state in (PAUSED, FAILED) for d in rows))
        self._update_download_buttons()
        f = self.selected_file()
        if f is not None and not f.local_path:
            self._update_download_button(f)

    def _update_download_buttons(self) -> None:
        d = self.selected_download()
        self.pause_button.setEnabled(d is not None and d.state == DOWNLOADING)
        self.resume_button.setEnabled(d is not None and d.state in (PAUSED, FAILED))
        self.cancel_button.setEnabled(
            d is not None and d.state in (DOWNLOADING, PAUSED, FAILED, DONE)
        )
        self.cancel_button.setText("Remove" if d is not None and d.state == DONE else "Cancel")
        self.open_button.setEnabled(d is not None and d.state == DONE)

    @Slot(str)
    def _on_downloaded(self, path: str) -> None:
        d = next((x for x in self.downloads.model.rows() if x.path == path), None)
        if d is not None:
            self.files.set_local_path(d.repo_id, d.filename, path)
            self._refresh_detail()
        self.model_downloaded.emit(path)

    @Slot(str, str)
    def _on_download_failed(self, reason: str, message: str) -> None:
        self._retry = self._resume_failed
        self._show_error(reason, message)

    def _resume_failed(self) -> None:
        for d in self.downloads.model.rows():
            if d.state == FAILED:
                self.downloads.resume(d)

    # tokens and errors ------------------------------------------------------------------------
    def use_token(self) -> None:
        token = self.token_edit.text().strip()
        if not token:
            return
        self.token = token
        self.token_edit.clear()
        self.token_row.hide()
        self._clear_error()
        retry, self._retry = self._retry, None
        if retry is not None:
            retry()

    def _show_error(self, reason: str, message: str) -> None:
        first = message.splitlines()[0] if message else "The Hub answered with an error"
        if reason == HubError.AUTH:
            self.error.setText(TOKEN_HELP)
            self.token_row.show()
            self.token_edit.setFocus()
        elif reason == HubError.OFFLINE:
            self.error.setText(f"No connection to the Hugging Face Hub: {first}")
        else:
            self.error.setText(first)
        self.error.setToolTip(message)
        self.error.show()

    def _clear_error(self) -> None:
        self.error.hide()
        self.error.setText("")
        self.token_row.hide()

    @Slot(int, str, str)
    def _on_call_failed(self, request: int, reason: str, message: str) -> None:
        if request in self._fit_requests:  # on the file's row and in the detail
            repo_id, filename = self._fit_requests.pop(request)
            self.files.set_fit_error(repo_id, filename, message.splitlines()[0])
            self._refresh_detail()
            f = self.selected_file()
            if reason == HubError.AUTH and f is not None and f.filename == filename:
                self._retry = lambda: self.check_fit(f)
                self._show_error(reason, message)
            return
        if request == self._search_request:
            self.repos_label.setText("Repositories")
            self._retry = self.search
        elif request == self._files_request:
            repo_id = self.files.repo_id
            self.files_label.setText(f"Files in {repo_id}")
            self._retry = lambda: self.list_files(repo_id)
        else:
            return  # the failure of a question no longer asked
        self._show_error(reason, message)

    # plumbing ---------------------------------------------------------------------------------
    def _next_request(self) -> int:
        self._request += 1
        return self._request

    def _call(self, request: int, fn, *args, result) -> None:
        worker = HubCallWorker(request, fn, *args)
        worker.result.connect(result)
        worker.hub_failed.connect(self._on_call_failed)
        self.ctx.pool.start(worker)


def _projector_words(f: HubFileInfo) -> str:
    """What downloads with a vision model, or '' for a text-only one."""
    if not f.mmproj:
        return ""
    size = f" ({human_bytes(f.mmproj_bytes)})" if f.mmproj_bytes else ""
    return (
        f"Reads images: its projector {f.mmproj}{size} downloads with it, as llama.cpp's -hf "
        f"brings it, and loads with it (the fit below counts the model alone)."
    )
