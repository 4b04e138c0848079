"""LoadPanel: load settings with a live memory estimate against free RAM; load with progress/cancel."""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from ..context import AppContext
from ..dto import LlmFileInfo, LoadParams, MemoryFigures
from ..format import human_bytes, human_count
from ..machine import available_ram
from ..workers import CallWorker, ModelLoadWorker
from .memory_dashboard import COLOURS
from .stacked_bar import Segment, StackedBar

KV_TYPES = ("f16", "f32", "q8_0")


class LoadPanel(QWidget):
    load_started = Signal()

    def __init__(self, ctx: AppContext, parent=None):
        super().__init__(parent)
        self.ctx = ctx
        self.info: LlmFileInfo | None = None
        self._load_worker: ModelLoadWorker | None = None
        self._estimate_timer = QTimer(self)
        self._estimate_timer.setSingleShot(True)
        self._estimate_timer.setInterval(150)
        self._estimate_timer.timeout.connect(self._estimate)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        layout.setSpacing(8)
        self.title = QLabel("Select a model", objectName="panelTitle", wordWrap=True)
        self.details = QLabel("Pick a file on the left, open one (Ctrl+O) or drop a .gguf here.",
                              wordWrap=True, objectName="dim")
        layout.addWidget(self.title)
        layout.addWidget(self.details)
        layout.addLayout(self._build_form())
        layout.addWidget(self._build_estimate())
        layout.addLayout(self._build_buttons())
        layout.addWidget(self._build_progress())
        layout.addStretch(1)
        self.set_params(ctx.settings.load)
        self._update_buttons()

    # building -------------------------------------------------------------------------------
    def _build_form(self) -> QFormLayout:
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.FieldsStayAtSizeHint)
        self.n_ctx = QSpinBox(minimum=256, maximum=262144, singleStep=1024, suffix=" tokens")
        self.n_seq_max = QSpinBox(minimum=1, maximum=16)
        self.n_seq_max.setToolTip("Parallel sequences: the chat uses one, the server the others")
        self.n_threads = QSpinBox(minimum=0, maximum=256, specialValueText="auto")
        self.type_k = QComboBox()
        self.type_k.addItems(KV_TYPES)
        for w in (self.n_ctx, self.n_seq_max, self.n_threads):  # not .start directly: start(int msec)
            w.valueChanged.connect(self._schedule_estimate)
        self.type_k.currentTextChanged.connect(self._schedule_estimate)
        form.addRow("Context size", self.n_ctx)
        form.addRow("Slots", self.n_seq_max)
        form.addRow("Threads", self.n_threads)
        form.addRow("KV cache type", self.type_k)
        return form

    def _build_estimate(self) -> QWidget:
        box = QWidget()
        col = QVBoxLayout(box)
        col.setContentsMargins(0, 6, 0, 0)
        col.addWidget(QLabel("Memory estimate", objectName="sectionTitle"))
        self.estimate_bar = StackedBar()
        self.estimate_label = QLabel("", wordWrap=True)
        col.addWidget(self.estimate_bar)
        col.addWidget(self.estimate_label)
        return box

    def _build_buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.load_button = QPushButton("Load model", objectName="primary", clicked=self.start_load)
        self.cancel_button = QPushButton("Cancel", clicked=self.cancel_load)
        self.unload_button = QPushButton("Unload", clicked=self.ctx.unload)
        row.addWidget(self.load_button)
        row.addWidget(self.cancel_button)
        row.addStretch(1)
        row.addWidget(self.unload_button)
        self.ctx.llm_loaded.connect(lambda _s: self._update_buttons())
        self.ctx.llm_unloaded.connect(self._update_buttons)
        return row

    def _build_progress(self) -> QWidget:
        box = QWidget()
        col = QVBoxLayout(box)
        col.setContentsMargins(0, 0, 0, 0)
        self.progress = QProgressBar(maximum=1000, textVisible=False)
        self.status = QLabel("", wordWrap=True)
        self.error = QLabel("", wordWrap=True, objectName="error")
        self.progress.hide()
        col.addWidget(self.progress)
        col.addWidget(self.status)
        col.addWidget(self.error)
        return box

    # state ----------------------------------------------------------------------------------
    def params(self) -> LoadParams:
        base = self.ctx.settings.load
        return LoadParams(self.n_ctx.value(), self.n_seq_max.value(), self.n_threads.value(),
                          self.type_k.currentText(), base.n_batch, base.n_ubatch)

    def set_params(self, p: LoadParams) -> None:
        self.n_ctx.setValue(p.n_ctx)
        self.n_seq_max.setValue(p.n_seq_max)
        self.n_threads.setValue(p.n_threads)
        self.type_k.setCurrentText(p.type_k)

    def set_info(self, info: LlmFileInfo | None) -> None:
        self.info = info
        self.error.setText("")
        if info is None:
            return
        self.title.setText(info.name)
        if info.error:
            self.details.setText(f"Cannot be loaded: {info.error}")
        else:
            self.details.setText(
                f"{info.arch} · {human_count(info.n_params)} parameters{_experts_words(info)} · {info.main_quant} · "
                f"{human_bytes(info.file_size)} · trained on {info.n_ctx_train:,} tokens · "
                f"chat template: {_template_words(info)}")
        self._update_buttons()
        self._schedule_estimate()

    def _update_buttons(self) -> None:
        loading = self._load_worker is not None
        usable = self.info is not None and not self.info.error
        self.load_button.setEnabled(usable and not loading)
        self.cancel_button.setVisible(loading)
        self.unload_button.setEnabled(self.ctx.session is not None and not loading)

    # estimate -------------------------------------------------------------------------------
    def _schedule_estimate(self, *_args) -> None:
        self._estimate_timer.start()

    def _estimate(self) -> None:
        if self.info is None or self.info.error:
            return
        worker = CallWorker(self.ctx.engine.estimate, self.info.path, self.params())
        worker.result.connect(self._show_estimate)
        worker.failed.connect(lambda msg: self.estimate_label.setText(f"No estimate: {msg}"))
        self.ctx.pool.start(worker)

    def _show_estimate(self, fig: MemoryFigures) -> None:
        free = available_ram()
        self.estimate_bar.set_segments([
            Segment("Weights", fig.weights_bytes, COLOURS["weights"]),
            Segment("KV cache", fig.kv_bytes, COLOURS["kv"]),
            Segment("Compute", fig.compute_bytes, COLOURS["compute"]),
        ], capacity=free, capacity_label="Free RAM")
        fits = fig.total_bytes < free
        self.estimate_label.setObjectName("" if fits else "error")
        self.estimate_label.setStyleSheet("" if fits else "color: #d9534f;")
        self.estimate_label.setText(
            f"Needs about {human_bytes(fig.total_bytes)}; {human_bytes(free)} of RAM is free."
            + ("" if fits else " It will not fit: lower the context size or slots, or use a "
               "smaller quantisation."))

    # loading --------------------------------------------------------------------------------
    def start_load(self) -> None:
        if self.info is None or self.info.error or self._load_worker is not None:
            return
        self.error.setText("")
        self.progress.setValue(0)
        self.progress.show()
        self._load_worker = self.ctx.load(self.info.path, self.params())
        self._load_worker.progressed.connect(self._on_progress)
        self._load_worker.loaded.connect(lambda s: self.status.setText(f"Loaded {s.name}."))
        self._load_worker.failed.connect(lambda msg: self.error.setText(f"Could not load the model.\n\n{msg}"))
        self._load_worker.cancelled.connect(lambda: self.status.setText("Loading cancelled."))
        self._load_worker.finished.connect(self._on_load_finished)
        self._update_buttons()
        self.load_started.emit()

    def cancel_load(self) -> None:
        if self._load_worker is not None:
            self._load_worker.cancel()

    def _on_progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(fraction * 1000))
        self.status.setText(message)

    def _on_load_finished(self) -> None:
        self._load_worker = None
        self.progress.hide()
        self._update_buttons()


def _template_words(info: LlmFileInfo) -> str:
    if info.has_chat_template:
        return "from the file"
    return f"none in the file; built-in '{info.template_name}' used" if info.template_name else "none"


def _experts_words(info: LlmFileInfo) -> str:
    """For a mixture of experts, what one token runs through: " (3.3B active: 8 of 128 experts)"."""
    if not info.n_expert:
        return ""
    return f" ({human_count(info.active_params)} active: {info.n_expert_used} of {info.n_expert} experts)"
