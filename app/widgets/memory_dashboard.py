"""MemoryDashboard: the engine's live memory report as figures, a stacked bar and a timeline,
plus the per-layer tensor table, KV use per slot, and the backends panel. While the chat talks
to a remote server that serves /slots or /metrics, the slot table shows its slots and the
timeline its throughput."""

from __future__ import annotations

from PySide6.QtCore import QSortFilterProxyModel, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QGroupBox,
    QHeaderView,
    QLabel,
    QLineEdit,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from ..dto import MemoryFigures, RemoteLoad, ReplyStep
from ..format import human_bytes
from ..item_models.layer_table_model import SORT_ROLE, LayerTableModel
from ..item_models.slot_table_model import SlotTableModel
from .backends_panel import BackendsPanel
from .stacked_bar import Segment, StackedBar
from .timeline_chart import Series, TimelineChart

COLOURS = {
    "weights": QColor("#3d7eff"), "kv": QColor("#a371f7"), "kv_free": QColor("#d2bdfb"),
    "compute": QColor("#3fb950"), "metadata": QColor("#d29922"), "rss": QColor("#8b949e"),
    "tok_s": QColor("#f0883e"), "server_tok_s": QColor("#db61a2"),
}
SLOTS_TITLE = "KV cache per slot"
SERVER_TOK_S = "server tokens/s"
FIGURES = ("Weights", "KV cache", "Compute buffer", "Metadata", "Process RSS", "Engine total")


class MemoryDashboard(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.figures = MemoryFigures()
        self.layer_model = LayerTableModel(self)
        self.slot_model = SlotTableModel(self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        layout.setSpacing(10)
        layout.addWidget(self._build_figures())
        layout.addWidget(self._build_bar())
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self._build_timeline())
        splitter.addWidget(self._build_tables())
        splitter.setSizes([260, 340])
        layout.addWidget(splitter, 1)

    # building -------------------------------------------------------------------------------
    def _build_figures(self) -> QWidget:
        box = QWidget()
        grid = QGridLayout(box)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(10)
        self.figure_labels: dict[str, QLabel] = {}
        for col, name in enumerate(FIGURES):
            card = QFrame(objectName="card")
            inner = QVBoxLayout(card)
            inner.setContentsMargins(12, 8, 12, 8)
            title = QLabel(name, objectName="cardTitle")
            value = QLabel("–", objectName="cardValue")
            detail = QLabel("", objectName="cardDetail")
            inner.addWidget(title)
            inner.addWidget(value)
            inner.addWidget(detail)
            self.figure_labels[name] = value
            self.figure_labels[name + ".detail"] = detail
            grid.addWidget(card, 0, col)
        return box

    def _build_bar(self) -> QWidget:
        self.bar = StackedBar()
        return self.bar

    def _build_timeline(self) -> QWidget:
        self.timeline = TimelineChart([
            Series("Process RSS", COLOURS["rss"]), Series("Weights resident", COLOURS["weights"]),
            Series("KV in use", COLOURS["kv"]), Series("tokens/s", COLOURS["tok_s"], right_axis=True),
            Series(SERVER_TOK_S, COLOURS["server_tok_s"], right_axis=True),
        ])
        return self.timeline

    def _build_tables(self) -> QWidget:
        splitter = QSplitter(Qt.Orientation.Horizontal)
        layers = QGroupBox("Tensors by layer")
        col = QVBoxLayout(layers)
        self.layer_filter = QLineEdit(placeholderText="Filter tensors (e.g. blk.3 or Q4_K)", clearButtonEnabled=True)
        self.layer_proxy = QSortFilterProxyModel(self)
        self.layer_proxy.setSourceModel(self.layer_model)
        self.layer_proxy.setSortRole(SORT_ROLE)
        self.layer_proxy.setFilterKeyColumn(-1)
        self.layer_filter.textChanged.connect(self.layer_proxy.setFilterFixedString)
        self.layer_view = _table(self.layer_proxy, stretch=1)
        self.layer_view.setSortingEnabled(True)
        self.layer_view.sortByColumn(0, Qt.SortOrder.AscendingOrder)
        self.layer_summary = QLabel("No model loaded", objectName="dim")
        col.addWidget(self.layer_filter)
        col.addWidget(self.layer_view, 1)
        col.addWidget(self.layer_summary)
        splitter.addWidget(layers)
        splitter.addWidget(self._build_side())
        splitter.setSizes([620, 380])
        return splitter

    def _build_side(self) -> QWidget:
        side = QWidget()
        col = QVBoxLayout(side)
        col.setContentsMargins(0, 0, 0, 0)
        slots = self.slots_box = QGroupBox(SLOTS_TITLE)
        slot_col = QVBoxLayout(slots)
        slot_col.addWidget(_table(self.slot_model, stretch=1, max_rows=6))
        self.remote_status = QLabel("", objectName="dim", wordWrap=True)
        self.remote_status.hide()
        slot_col.addWidget(self.remote_status)
        backends = QGroupBox("Backends")
        self.backends = BackendsPanel()
        QVBoxLayout(backends).addWidget(self.backends)
        col.addWidget(slots)
        col.addWidget(backends, 1)
        return side

    # updates --------------------------------------------------------------------------------
    def set_layers(self, rows) -> None:
        self.layer_model.set_rows(rows)
        total = self.layer_model.total_bytes()
        self.layer_summary.setText(
            f"{len(rows)} tensors in {self.layer_model.n_layers()} layers · {human_bytes(total)}"
            if rows else "No model loaded")

    def set_figures(self, fig: MemoryFigures) -> None:
        self.figures = fig
        resident = min(fig.weights_resident_bytes, fig.weights_bytes)  # smaps counts the header too
        mapped_only = fig.weights_bytes - resident
        self._set_figure("Weights", fig.weights_bytes, f"{human_bytes(fig.weights_resident_bytes)} resident")
        self._set_figure("KV cache", fig.kv_bytes, f"{human_bytes(fig.kv_used_bytes)} in use")
        self._set_figure("Compute buffer", fig.compute_bytes, "allocated once")
        self._set_figure("Metadata", fig.metadata_bytes, "tensor descriptors")
        self._set_figure("Process RSS", fig.rss_bytes, "whole process")
        self._set_figure("Engine total", fig.total_bytes, "weights + KV + compute")
        self.bar.set_segments([
            Segment("Weights resident", resident, COLOURS["weights"]),
            Segment("Weights mapped, not resident", mapped_only, COLOURS["weights"], hatched=True),
            Segment("KV in use", fig.kv_used_bytes, COLOURS["kv"]),
            Segment("KV free", max(fig.kv_bytes - fig.kv_used_bytes, 0), COLOURS["kv_free"]),
            Segment("Compute", fig.compute_bytes, COLOURS["compute"]),
            Segment("Metadata", fig.metadata_bytes, COLOURS["metadata"]),
        ])
        self.slot_model.set_figures(fig)
        self.timeline.add("Process RSS", fig.rss_bytes)
        self.timeline.add("Weights resident", fig.weights_resident_bytes)
        self.timeline.add("KV in use", fig.kv_used_bytes)

    def add_step(self, step: ReplyStep) -> None:
        if step.t_gen_ms > 0 and step.n_generated >= 4:  # the first tokens' rate is noise
            self.timeline.add("tokens/s", step.n_generated * 1000.0 / step.t_gen_ms)

    def set_remote_load(self, load: RemoteLoad, label: str) -> None:
        """A poll of the remote server the chat talks to."""
        self.slots_box.setTitle(f"Slots on {label}")
        if load.error:
            self.remote_status.setText(f"Not answering: {load.error.splitlines()[-1]}")
        else:
            self.slot_model.set_remote_slots(load.slots)
            busy = sum(s.busy for s in load.slots)
            words = [f"{busy} of {len(load.slots)} slots busy"] if load.slots else ["no /slots"]
            if load.tokens_per_s is not None:
                words.append(f"{load.tokens_per_s:.1f} tokens/s generated")
            self.remote_status.setText(" · ".join(words))
        self.remote_status.show()
        if load.tokens_per_s is not None:
            self.timeline.add(SERVER_TOK_S, load.tokens_per_s)

    def clear_remote(self, label: str = "") -> None:
        """No remote server polled (`label`: one that serves neither /slots nor /metrics)."""
        self.slot_model.clear_remote()
        self.slot_model.set_figures(self.figures)
        self.slots_box.setTitle(SLOTS_TITLE)
        self.remote_status.setText(f"{label} serves no /slots or /metrics to show." if label else "")
        self.remote_status.setVisible(bool(label))

    def _set_figure(self, name: str, value: int, detail: str) -> None:
        self.figure_labels[name].setText(human_bytes(value))
        self.figure_labels[name + ".detail"].setText(detail)


def _table(model, stretch: int, max_rows: int = 0) -> QTableView:
    view = QTableView()
    view.setModel(model)
    view.verticalHeader().hide()
    view.setAlternatingRowColors(True)
    view.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
    view.setShowGrid(False)
    view.verticalHeader().setDefaultSectionSize(view.fontMetrics().height() + 8)
    header = view.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(stretch, QHeaderView.ResizeMode.Stretch)
    if max_rows:
        view.setMaximumHeight(header.sizeHint().height() + max_rows * (view.fontMetrics().height() + 8) + 4)
    return view
