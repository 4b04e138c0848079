"""BackendsPanel: the CPU the numba engine targets, its SIMD features, and OpenGL if readable."""

from __future__ import annotations

from PySide6.QtWidgets import QFormLayout, QLabel, QWidget

from ..dto import BackendInfo


class BackendsPanel(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.form = QFormLayout(self)
        self.form.setContentsMargins(0, 0, 0, 0)
        self.labels: dict[str, QLabel] = {}
        for key in ("CPU", "Cores / threads", "numba target", "SIMD", "OpenGL renderer", "OpenGL version"):
            label = QLabel("…", wordWrap=True)
            label.setTextInteractionFlags(label.textInteractionFlags().TextSelectableByMouse)
            self.labels[key] = label
            self.form.addRow(key, label)

    def set_backend(self, info: BackendInfo) -> None:
        self.labels["CPU"].setText(info.cpu_model)
        self.labels["Cores / threads"].setText(
            f"{info.n_cores} cores, {info.n_logical} logical · engine uses {info.n_threads} threads")
        self.labels["numba target"].setText(info.cpu_target)
        self.labels["SIMD"].setText(", ".join(info.simd) or "none detected")

    def set_opengl(self, renderer: str, version: str) -> None:
        self.labels["OpenGL renderer"].setText(renderer)
        self.labels["OpenGL version"].setText(version)
