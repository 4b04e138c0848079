"""BackendsPanel: the CPU the numba engine targets, its SIMD features, and every compute device
the engine found (engine.backends.list_devices): memory, and whether it can be used or why not."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFormLayout, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from ..dto import BackendInfo, DeviceDesc
from ..format import human_bytes

CPU_ROWS = ("CPU", "Cores / threads", "numba target", "SIMD")
GL_ROWS = (
    "OpenGL renderer",
    "OpenGL version",
)  # what the display's GL says, when no GL device is listed


class BackendsPanel(QWidget):
    refresh_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        col = QVBoxLayout(self)
        col.setContentsMargins(8, 6, 8, 6)
        self.form = QFormLayout()
        self.labels: dict[str, QLabel] = {}
        for key in CPU_ROWS + GL_ROWS:
            self.labels[key] = self._add_row(self.form, key)
        col.addLayout(self.form)
        title = QHBoxLayout()
        title.addWidget(QLabel("Compute devices", objectName="sectionTitle"))
        title.addStretch(1)
        self.refresh_link = QLabel('<a href="#refresh">look again</a>')
        self.refresh_link.setToolTip("Probe the GPU devices again (free memory changes)")
        self.refresh_link.linkActivated.connect(lambda _href: self.refresh_requested.emit())
        title.addWidget(self.refresh_link)
        col.addLayout(title)
        self.device_form = QFormLayout()
        self.device_labels: dict[str, QLabel] = {}
        self.devices: list[DeviceDesc] = []
        col.addLayout(self.device_form)
        col.addStretch(1)
        self._show_devices([])

    @staticmethod
    def _add_row(form: QFormLayout, key: str) -> QLabel:
        label = QLabel("…", wordWrap=True)
        label.setTextInteractionFlags(label.textInteractionFlags().TextSelectableByMouse)
        form.addRow(key, label)
        return label

    def set_backend(self, info: BackendInfo) -> None:
        self.labels["CPU"].setText(info.cpu_model)
        self.labels["Cores / threads"].setText(
            f"{info.n_cores} cores, {info.n_logical} logical · engine uses {info.n_threads} threads"
        )
        self.labels["numba target"].setText(info.cpu_target)
        self.labels["SIMD"].setText(", ".join(info.simd) or "none detected")

    def set_opengl(self, renderer: str, version: str) -> None:
        self.labels["OpenGL renderer"].setText(renderer)
        self.labels["OpenGL version"].setText(version)

    def set_devices(self, devices: list[DeviceDesc]) -> None:
        self.devices = list(devices)
        self._show_devices(self.devices)

    def _show_devices(self, devices: list[DeviceDesc]) -> None:
        while self.device_form.rowCount():
            self.device_form.removeRow(0)
        self.device_labels = {}
        for d in devices:
            label = self._add_row(
                self.device_form, d.name if d.name == d.backend else f"{d.name} · {d.backend}"
            )
            label.setText(device_text(d))
            label.setObjectName("" if d.available else "dim")  # new label: styled when first shown
            self.device_labels[d.name] = label
        if not any(d.is_gpu for d in devices):
            note = self._add_row(self.device_form, "GPU")
            note.setText("none found: every layer runs on the CPU" if devices else "looking…")
            self.device_labels["GPU"] = note
        # a listed GL device names its renderer and version itself
        has_gl = any(d.backend == "OpenGL" for d in devices)
        for key in GL_ROWS:
            self.form.setRowVisible(self.labels[key], not has_gl)


def device_text(d: DeviceDesc) -> str:
    """Two lines: what it is; its memory, capabilities and whether it can be used. (The CPU's
    one: the rows above describe it already.)"""
    if d.total_bytes is None and d.free_bytes is None:
        memory = "memory size not reported"
    elif d.free_bytes is None:
        memory = f"{human_bytes(d.total_bytes or 0)} total, free not reported"
    else:
        total = human_bytes(d.total_bytes) if d.total_bytes is not None else "?"
        memory = f"{total} total · {human_bytes(d.free_bytes)} free"
    if d.caps:
        memory += " · " + ", ".join(d.caps)
    state = "available" if d.available else f"not available: {d.reason or 'no reason given'}"
    return f"{memory} · {state}" if not d.is_gpu else f"{d.description}\n{memory} · {state}"
