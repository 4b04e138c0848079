"""ServerToggle: a toolbar button with a status light; checked while the server runs."""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QToolButton

OFF, ON, FAILED = QColor("#8b949e"), QColor("#3fb950"), QColor("#f85149")


def _light(colour: QColor) -> QIcon:
    pm = QPixmap(32, 32)
    pm.fill(Qt.GlobalColor.transparent)
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(colour)
    p.drawEllipse(QRectF(8, 8, 16, 16))
    p.end()
    return QIcon(pm)


class ServerToggle(QToolButton):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setCheckable(True)
        self.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.setIconSize(QSize(14, 14))
        self.set_state(None)

    def set_state(self, url: str | None, failed: bool = False) -> None:
        self.blockSignals(True)
        self.setChecked(bool(url))
        self.blockSignals(False)
        self.setIcon(_light(ON if url else FAILED if failed else OFF))
        self.setText(f"Server: {url}" if url else "Server: off")
        self.setToolTip("Stop the server" if url else "Start the OpenAI-compatible server")
