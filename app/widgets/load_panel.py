"""LoadPanel: load settings (GPU layers included) with a live memory estimate against free RAM
and, when layers are offloaded, the GPU's free memory; load with progress/cancel."""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
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
from ..dto import DeviceShare, LlmFileInfo, LoadParams, MemoryFigures
from ..format import human_bytes, human_count
from ..machine import available_ram
from ..workers import CallWorker, ModelLoadWorker
from .memory_dashboard import COLOURS, projector_segments
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
        self.details = QLabel(
            "Pick a file on the left, open one (Ctrl+O) or drop a .gguf here.",
            wordWrap=True,
            objectName="dim",
        )
        layout.addWidget(self.title)
        layout.addWidget(self.details)
        layout.addLayout(self._build_form())
        layout.addWidget(self._build_estimate())
        layout.addLayout(self._build_buttons())
        layout.addWidget(self._build_progress())
        layout.addStretch(1)
        self.set_params(ctx.settings.load)
        self._update_buttons()
        self._update_gpu_control()
        ctx.devices_found.connect(self._on_devices_found)

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
        for w in (
            self.n_ctx,
            self.n_seq_max,
            self.n_threads,
        ):  # not .start directly: start(int msec)
            w.valueChanged.connect(self._schedule_estimate)
        self.type_k.currentTextChanged.connect(self._schedule_estimate)
        form.addRow("Context size", self.n_ctx)
        form.addRow("Slots", self.n_seq_max)
        form.addRow("Threads", self.n_threads)
        form.addRow("KV cache type", self.type_k)
        self.gpu_label = QLabel("GPU layers")
        form.addRow(self.gpu_label, self._build_gpu_control())
        return form

    def _build_gpu_control(self) -> QWidget:
        box = QWidget()
        row = QHBoxLayout(box)
        row.setContentsMargins(0, 0, 0, 0)
        self.n_gpu_layers = QSpinBox(minimum=0, maximum=999)
        self.gpu_all = QCheckBox("all")
        self.gpu_hint = QLabel("", objectName="dim")
        self.n_gpu_layers.valueChanged.connect(self._schedule_estimate)
        self.gpu_all.toggled.connect(self._on_gpu_all_toggled)
        row.addWidget(self.n_gpu_layers)
        row.addWidget(self.gpu_all)
        row.addWidget(self.gpu_hint)
        row.addStretch(1)
        return box

    def _build_estimate(self) -> QWidget:
        box = QWidget()
        col = QVBoxLayout(box)
        col.setContentsMargins(0, 6, 0, 0)
        col.addWidget(QLabel("Memory estimate", objectName="sectionTitle"))
        self.estimate_bar = StackedBar()
        self.estimate_label = QLabel("", wordWrap=True)
        # with layers offloaded: the bar above is the CPU's share, this one the GPU's
        self.ram_title = QLabel("CPU (RAM)", objectName="dim")
        self.gpu_title = QLabel("", objectName="dim")
        self.gpu_bar = StackedBar()
        col.addWidget(self.ram_title)
        col.addWidget(self.estimate_bar)
        col.addWidget(self.gpu_title)
        col.addWidget(self.gpu_bar)
        col.addWidget(self.estimate_label)
        for w in (self.ram_title, self.gpu_title, self.gpu_bar):
            w.hide()
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
        n_gpu = -1 if self.gpu_all.isChecked() else self.n_gpu_layers.value()
        return LoadParams(
            self.n_ctx.value(),
            self.n_seq_max.value(),
            self.n_threads.value(),
            self.type_k.currentText(),
            base.n_batch,
            base.n_ubatch,
            n_gpu,
            self.info.mmproj if self.info is not None and not self.info.error else "",
        )

    def set_params(self, p: LoadParams) -> None:
        self.n_ctx.setValue(p.n_ctx)
        self.n_seq_max.setValue(p.n_seq_max)
        self.n_threads.setValue(p.n_threads)
        self.type_k.setCurrentText(p.type_k)
        self.gpu_all.setChecked(p.n_gpu_layers < 0)
        if p.n_gpu_layers >= 0:
            self.n_gpu_layers.setValue(p.n_gpu_layers)

    # GPU layers -----------------------------------------------------------------------------
    def _on_devices_found(self, _devices) -> None:
        self._update_gpu_control()
        self._schedule_estimate()

    def _on_gpu_all_toggled(self, checked: bool) -> None:
        self._update_gpu_control()
        self._schedule_estimate()

    def _update_gpu_control(self) -> None:
        """Range from the model's layer count; enabled only with a usable GPU, else a tooltip
        says why the CPU runs everything."""
        n_layer = self.info.n_layer if self.info is not None and not self.info.error else 0
        if n_layer:
            self.n_gpu_layers.setMaximum(n_layer + 1)
        gpu = self.ctx.gpu_device()
        if gpu is None:  # the tooltip has the whole reason
            self.gpu_hint.setText("CPU only: no usable GPU" if self.ctx.devices else "")
        else:
            self.gpu_hint.setText(
                f"of {n_layer + 1} on {gpu.name} (the output layer counts as the last)"
                if n_layer
                else ""
            )
        tip = (
            _gpu_tooltip(self.ctx.devices, n_layer)
            if gpu is None
            else (
                f"Layers to run on {gpu.name} ({gpu.description}): the last ones first, with their KV "
                f"cache, as llama.cpp's -ngl, where the output layer counts as the last: 1 moves it "
                f"alone"
                + (f", {n_layer + 1} every layer" if n_layer else "")
                + ". 'all': every layer and the output."
            )
        )
        for w in (self.gpu_label, self.n_gpu_layers, self.gpu_all, self.gpu_hint):
            w.setToolTip(tip)
            w.setEnabled(gpu is not None)
        self.n_gpu_layers.setEnabled(gpu is not None and not self.gpu_all.isChecked())

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
                f"chat template: {_template_words(info)} · "
                + (f"vision, {info.mmproj_note}" if info.mmproj else "text only")
            )
            self.details.setToolTip(info.mmproj_note)
        self._update_buttons()
        self._update_gpu_control()
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
        host = next((d for d in fig.devices if d.device == "CPU"), None)
        w, kv, compute = (
            (host.weights_bytes, host.kv_bytes, host.compute_bytes)
            if host
            else (fig.weights_bytes, fig.kv_bytes, fig.compute_bytes)
        )
        # the bar adds up to the RAM the sentence below names (host_bytes): the CPU's share,
        # the tensor descriptors and the vision projector, which stays in RAM
        self.estimate_bar.set_segments(
            [
                Segment("Weights", w, COLOURS["weights"]),
                Segment("KV cache", kv, COLOURS["kv"]),
                Segment("Compute", compute, COLOURS["compute"]),
                Segment("Metadata", fig.metadata_bytes, COLOURS["metadata"]),
                *projector_segments(fig),
            ],
            capacity=free,
            capacity_label="Free RAM",
        )
        fits = fig.host_bytes < free
        gpu = fig.gpu_shares[0] if fig.gpu_shares else None
        who = "The CPU needs" if gpu is not None else "Needs"
        words = [f"{who} about {human_bytes(fig.host_bytes)}; {human_bytes(free)} of RAM is free."]
        if not fits:
            words.append(
                "It will not fit: lower the context size or slots, or use a smaller quantisation."
            )
        if gpu is not None:
            n_cpu = host.n_layers if host is not None else 0
            self.ram_title.setText(f"CPU (RAM): {n_cpu} {_layers(n_cpu)}")
            words.append(self._show_gpu_share(gpu))
            fits = fits and gpu.verdict != "too big"
        for widget in (self.ram_title, self.gpu_title, self.gpu_bar):
            widget.setVisible(gpu is not None)
        self.estimate_label.setObjectName("" if fits else "error")
        self.estimate_label.setStyleSheet("" if fits else "color: #d9534f;")
        self.estimate_label.setText(" ".join(words))

    def _show_gpu_share(self, gpu: DeviceShare) -> str:
        """Draws the GPU's bar; returns the sentence on whether its share fits."""
        self.gpu_title.setText(f"{gpu.device} (GPU memory): {gpu.n_layers} {_layers(gpu.n_layers)}")
        self.gpu_bar.set_segments(
            [
                Segment("Weights", gpu.weights_bytes, COLOURS["weights"]),
                Segment("KV cache", gpu.kv_bytes, COLOURS["kv"]),
                Segment("Compute", gpu.compute_bytes, COLOURS["compute"]),
            ],
            capacity=gpu.capacity_bytes,
            capacity_label=f"Free on {gpu.device}",
        )
        need = f"{gpu.device} needs about {human_bytes(gpu.total_bytes)}"
        room = f"{human_bytes(gpu.capacity_bytes)} is free"
        if gpu.verdict == "too big":
            return (
                f"{need}; only {room}. It will not fit in GPU memory: use fewer GPU layers or "
                f"a smaller context."
            )
        if gpu.verdict == "tight":
            return f"{need}; {room}: it is close, other programs' use of the GPU may tip it over."
        if gpu.verdict == "unknown":
            return f"{need}; the driver does not report its memory, so the fit cannot be checked."
        return f"{need}; {room}."

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
        self._load_worker.failed.connect(
            lambda msg: self.error.setText(f"Could not load the model.\n\n{msg}")
        )
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


def _layers(n: int) -> str:
    return "layer" if n == 1 else "layers"


def _gpu_tooltip(devices, n_layer: int) -> str:
    """Why the GPU layers control is off."""
    if not devices:
        return "Looking for GPU devices…"
    gpus = [d for d in devices if d.is_gpu]
    if not gpus:
        return "No GPU device found: every layer runs on the CPU."
    return "No usable GPU: " + "; ".join(
        f"{d.name} ({d.backend}): {d.reason or 'not available'}" for d in gpus
    )


def _template_words(info: LlmFileInfo) -> str:
    if info.has_chat_template:
        return "from the file"
    return (
        f"none in the file; built-in '{info.template_name}' used" if info.template_name else "none"
    )


def _experts_words(info: LlmFileInfo) -> str:
    """For a mixture of experts, what one token runs through: " (3.3B active: 8 of 128 experts)"."""
    if not info.n_expert:
        return ""
    return f" ({human_count(info.active_params)} active: {info.n_expert_used} of {info.n_expert} experts)"
