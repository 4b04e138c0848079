"""ContextGauge: tokens used of the context, with the overflow policy stated in advance."""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPalette
from PySide6.QtWidgets import QSizePolicy, QWidget

from ..context_policy import CONTEXT_POLICY
from ..theme import mix

WARN_AT, FULL_AT = 0.75, 0.9


class ContextGauge(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.used, self.n_ctx = 0, 0
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.setToolTip(CONTEXT_POLICY)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(
            self.fontMetrics().horizontalAdvance("00,000 / 000,000 tokens · 100%") + 24,
            self.fontMetrics().height() + 8,
        )

    def set_usage(self, used: int, n_ctx: int) -> None:
        self.used, self.n_ctx = used, n_ctx
        self.setToolTip(f"{used:,} of {n_ctx:,} context tokens in use.\n\n{CONTEXT_POLICY}")
        self.update()

    def fraction(self) -> float:
        return min(self.used / self.n_ctx, 1.0) if self.n_ctx else 0.0

    def text(self) -> str:
        if not self.n_ctx:
            return "no model loaded"
        return f"{self.used:,} / {self.n_ctx:,} tokens · {100 * self.fraction():.0f}%"

    def paintEvent(self, _event) -> None:  # noqa: N802
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        p.setPen(pal.color(QPalette.ColorRole.Mid))
        p.setBrush(pal.color(QPalette.ColorRole.Base))
        p.drawRoundedRect(r, 5, 5)
        f = self.fraction()
        colour = (
            QColor("#3fb950")
            if f < WARN_AT
            else QColor("#d29922")
            if f < FULL_AT
            else QColor("#f85149")
        )
        if f > 0:
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(mix(pal.color(QPalette.ColorRole.Base), colour, 0.45))
            p.drawRoundedRect(QRectF(r.left(), r.top(), max(r.width() * f, 10), r.height()), 5, 5)
        p.setPen(pal.color(QPalette.ColorRole.Text))
        p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, self.text())
