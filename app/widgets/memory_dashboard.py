"""MemoryDashboard: the engine's live memory report as figures, a stacked bar (one more per
device when layers are offloaded to a GPU) and a timeline, plus the per-layer tensor table, KV
use per slot, and the backends panel. While the chat talks to a remote server that serves
/slots or /metrics, the slot table shows its slots and the timeline its throughput."""

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
    QScrollArea,
    QSplitter,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from ..dto import DeviceDesc, DeviceShare, MemoryFigures, RemoteLoad, ReplyStep
from ..format import human_bytes
from ..item_models.layer_table_model import SORT_ROLE, LayerTableModel
from ..item_models.slot_table_model import SlotTableModel
from .backends_panel import BackendsPanel
from .stacked_bar import Segment, StackedBar
from .timeline_chart import Series, TimelineChart

COLOURS = {
    "weights": QColor("#3d7eff"),
    "kv": QColor("#a371f7"),
    "kv_free": QColor("#d2bdfb"),
    "compute": QColor("#3fb950"),
    "metadata": QColor("#d29922"),
    "rss": QColor("#8b949e"),
    "projector": QColor("#1f9bab"),
    "projector_buffer": QColor("#8fd6de"),
    "tok_s": QColor("#f0883e"),
    "server_tok_s": QColor("#db61a2"),
}
SLOTS_TITLE = "KV cache per slot"
SERVER_TOK_S = "server tokens/s"
# the projector's two rows of the bars; one card shows both (with a card each, the row of cards
# set the window's minimum width near 1200 px)
PROJECTOR_WEIGHTS, IMAGE_BUFFER = "Projector weights", "Image encode buffer"
PROJECTOR = "Projector"
FIGURES = (
    "Weights",
    "KV cache",
    "Compute buffer",
    "Metadata",
    PROJECTOR,
    "Process RSS",
    "Engine total",
)


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
        layout.addWidget(self._build_device_bars())
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
        self.figure_cards: dict[str, QFrame] = {}
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
            self.figure_cards[name] = card
            grid.addWidget(card, 0, col)
        self.figure_cards[PROJECTOR].hide()  # shown with a vision model only
        return box

    def _build_bar(self) -> QWidget:
        self.bar = StackedBar()
        return self.bar

    def _build_device_bars(self) -> QWidget:
        """One column per device (title over a bar of its weights / KV / compute), shown when
        the loaded context spans more than one device. Side by side: the tab is tall enough."""
        self.device_box = QWidget()
        self.device_grid = QGridLayout(self.device_box)
        self.device_grid.setContentsMargins(0, 0, 0, 0)
        self.device_grid.setHorizontalSpacing(24)
        self.device_grid.setVerticalSpacing(2)
        self.device_titles: dict[str, QLabel] = {}
        self.device_bars: dict[str, StackedBar] = {}
        self.device_list: list[DeviceDesc] = []
        self.device_box.hide()
        return self.device_box

    def _build_timeline(self) -> QWidget:
        self.timeline = TimelineChart(
            [
                Series("Process RSS", COLOURS["rss"]),
                Series("Weights resident", COLOURS["weights"]),
                Series("KV in use", COLOURS["kv"]),
                Series("tokens/s", COLOURS["tok_s"], right_axis=True),
                Series(SERVER_TOK_S, COLOURS["server_tok_s"], right_axis=True),
            ]
        )
        return self.timeline

    def _build_tables(self) -> QWidget:
        splitter = QSplitter(Qt.Orientation.Horizontal)
        layers = QGroupBox("Tensors by layer")
        col = QVBoxLayout(layers)
        self.layer_filter = QLineEdit(
            placeholderText="Filter tensors (e.g. blk.3 or Q4_K)", clearButtonEnabled=True
        )
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

    def _build_side(self) -> QTabWidget:
        """KV use per slot (or a remote server's slots) and the backends, one tab each: with
        GPU devices listed the two do not fit one above the other in a window of ordinary
        height."""
        self.side_tabs = QTabWidget()
        slots = QWidget()
        slot_col = QVBoxLayout(slots)
        slot_col.setContentsMargins(0, 0, 0, 0)
        slot_col.addWidget(_table(self.slot_model, stretch=1))
        self.remote_status = QLabel("", objectName="dim", wordWrap=True)
        self.remote_status.hide()
        slot_col.addWidget(self.remote_status)
        self.side_tabs.addTab(slots, SLOTS_TITLE)
        self.backends = BackendsPanel()
        scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(self.backends)
        self.side_tabs.addTab(scroll, "Backends")
        return self.side_tabs

    # updates --------------------------------------------------------------------------------
    def set_layers(self, rows) -> None:
        self.layer_model.set_rows(rows)
        total = self.layer_model.total_bytes()
        self.layer_summary.setText(
            f"{len(rows)} tensors in {self.layer_model.n_layers()} layers · {human_bytes(total)}"
            if rows
            else "No model loaded"
        )

    def set_figures(self, fig: MemoryFigures) -> None:
        self.figures = fig
        # the interleaved copies stand in RAM for their mapped bytes (the same size, padding aside);
        # smaps counts the file's header pages as resident too
        repacked = min(fig.repacked_bytes, fig.weights_bytes)
        resident = min(fig.weights_resident_bytes, fig.weights_bytes - repacked)
        mapped_only = fig.weights_bytes - resident - repacked
        detail = f"{human_bytes(fig.weights_resident_bytes)} resident"
        if fig.repacked_bytes:
            detail = f"{human_bytes(fig.repacked_bytes)} repacked · {human_bytes(fig.weights_resident_bytes)} mapped"
        self._set_figure("Weights", fig.weights_bytes, detail)
        self._set_figure("KV cache", fig.kv_bytes, f"{human_bytes(fig.kv_used_bytes)} in use")
        self._set_figure("Compute buffer", fig.compute_bytes, "allocated once")
        self._set_figure("Metadata", fig.metadata_bytes, "tensor descriptors")
        self._set_figure(
            PROJECTOR,
            fig.projector_weights_bytes,
            f"+ {human_bytes(fig.projector_compute_bytes)} image buffer",
        )
        self.figure_cards[PROJECTOR].setVisible(fig.projector_bytes > 0)
        self.figure_cards[PROJECTOR].setToolTip(
            f"{PROJECTOR_WEIGHTS}: the mmproj's tensors, in RAM.\n{IMAGE_BUFFER}: the largest "
            "activations of one image tile's encode."
        )
        self._set_figure("Process RSS", fig.rss_bytes, "whole process")
        self._set_figure("Engine total", fig.total_bytes, "sum of the bar")
        # the segments add up to the total: every figure above is one (or, split, several)
        self.bar.set_segments(
            [
                Segment("Weights resident", resident, COLOURS["weights"]),
                Segment(
                    "Weights mapped, not resident", mapped_only, COLOURS["weights"], hatched=True
                ),
                Segment("Weights repacked", repacked, COLOURS["weights"]),
                Segment("KV in use", fig.kv_used_bytes, COLOURS["kv"]),
                Segment("KV free", max(fig.kv_bytes - fig.kv_used_bytes, 0), COLOURS["kv_free"]),
                Segment("Compute", fig.compute_bytes, COLOURS["compute"]),
                Segment("Metadata", fig.metadata_bytes, COLOURS["metadata"]),
                *projector_segments(fig),
            ]
        )
        self._set_device_bars(fig.devices)
        self.slot_model.set_figures(fig)
        self.timeline.add("Process RSS", fig.rss_bytes)
        self.timeline.add("Weights resident", fig.weights_resident_bytes + fig.repacked_bytes)
        self.timeline.add("KV in use", fig.kv_used_bytes)

    def set_devices(self, devices: list[DeviceDesc]) -> None:
        self.device_list = list(devices)
        self.backends.set_devices(devices)
        self._set_device_bars(self.figures.devices)

    def _set_device_bars(self, shares: tuple[DeviceShare, ...]) -> None:
        if len(shares) <= 1:  # the CPU alone: the bar above says it all
            self.device_box.hide()
            return
        if [d.device for d in shares] != list(self.device_bars):
            self._rebuild_device_rows([d.device for d in shares])
        known = {d.name: d for d in self.device_list}
        for d in shares:
            desc = known.get(d.device)
            capacity = (desc.total_bytes or 0) if desc is not None and desc.is_gpu else 0
            layers = "layer" if d.n_layers == 1 else "layers"
            # the projector runs on the CPU: its rows are the CPU column's too
            extra = projector_segments(self.figures) if d.device == "CPU" else []
            self.device_titles[d.device].setText(
                f"{d.device}: {d.n_layers} {layers} · "
                f"{human_bytes(d.total_bytes + sum(int(s.value) for s in extra))}"
            )
            self.device_bars[d.device].set_segments(
                [
                    Segment("Weights", d.weights_bytes, COLOURS["weights"]),
                    Segment("KV cache", d.kv_bytes, COLOURS["kv"]),
                    Segment("Compute", d.compute_bytes, COLOURS["compute"]),
                    *extra,
                ],
                capacity=capacity,
                capacity_label="Device memory",
            )
        self.device_box.show()

    def _rebuild_device_rows(self, names: list[str]) -> None:
        for widget in [*self.device_titles.values(), *self.device_bars.values()]:
            self.device_grid.removeWidget(widget)
            widget.deleteLater()
        self.device_titles, self.device_bars = {}, {}
        for col, name in enumerate(names):
            self.device_titles[name] = title = QLabel(name, objectName="cardTitle")
            self.device_bars[name] = bar = StackedBar()
            self.device_grid.addWidget(title, 0, col)
            self.device_grid.addWidget(bar, 1, col)
            self.device_grid.setColumnStretch(col, 1)

    def add_step(self, step: ReplyStep) -> None:
        if step.t_gen_ms > 0 and step.n_generated >= 4:  # the first tokens' rate is noise
            self.timeline.add("tokens/s", step.n_generated * 1000.0 / step.t_gen_ms)

    def set_remote_load(self, load: RemoteLoad, label: str) -> None:
        """A poll of the remote server the chat talks to."""
        self.side_tabs.setTabText(0, f"Slots on {label}")
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
        self.side_tabs.setTabText(0, SLOTS_TITLE)
        self.remote_status.setText(
            f"{label} serves no /slots or /metrics to show." if label else ""
        )
        self.remote_status.setVisible(bool(label))

    def _set_figure(self, name: str, value: int, detail: str) -> None:
        self.figure_labels[name].setText(human_bytes(value))
        self.figure_labels[name + ".detail"].setText(detail)


def projector_segments(fig: MemoryFigures) -> list[Segment]:
    """The vision projector's two rows of a bar ([] without one); the load panel's estimate
    draws the same."""
    if not fig.projector_bytes:
        return []
    return [
        Segment(PROJECTOR_WEIGHTS, fig.projector_weights_bytes, COLOURS["projector"]),
        Segment(IMAGE_BUFFER, fig.projector_compute_bytes, COLOURS["projector_buffer"]),
    ]


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
        view.setMaximumHeight(
            header.sizeHint().height() + max_rows * (view.fontMetrics().height() + 8) + 4
        )
    return view
