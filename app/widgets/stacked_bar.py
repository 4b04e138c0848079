"""StackedBar: one horizontal bar split into coloured segments, with a legend underneath."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPalette
from PySide6.QtWidgets import QSizePolicy, QWidget

from ..format import human_bytes

BAR_H, SWATCH, LEGEND_GAP = 22, 10, 18


@dataclass(frozen=True)
class Segment:
    label: str
    value: float
    colour: QColor
    hatched: bool = False  # e.g. mapped but not resident


class StackedBar(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.segments: list[Segment] = []
        self.capacity = 0.0  # draw a marker (e.g. free RAM) when > 0
        self.capacity_label = ""
        self._laid_out = False  # until the first resize, the width is not the layout's
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:  # noqa: N802
        # as tall as the legend wraps at the current width (one line or two before the first
        # layout): a bar whose legend fits on one line takes no room for a second
        lines = self._legend_lines(self.width()) if self._laid_out else 2
        return QSize(400, BAR_H + 8 + lines * (self.fontMetrics().height() + 6) + 4)

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(200, self.sizeHint().height())

    def set_segments(
        self, segments: list[Segment], capacity: float = 0.0, capacity_label: str = ""
    ) -> None:
        self.segments, self.capacity, self.capacity_label = segments, capacity, capacity_label
        self.updateGeometry()
        self.update()

    def resizeEvent(self, event) -> None:  # noqa: N802
        self._laid_out = True
        if self._legend_lines(event.size().width()) != self._legend_lines(event.oldSize().width()):
            self.updateGeometry()
        super().resizeEvent(event)

    def _legend_items(self) -> list[tuple[QColor, str]]:
        items = [(s.colour, f"{s.label} {human_bytes(s.value)}") for s in self.segments]
        if self.capacity > 0:
            items.append((QColor("#f85149"), f"{self.capacity_label} {human_bytes(self.capacity)}"))
        return items

    def _legend_lines(self, width: int) -> int:
        """Lines the legend takes at `width`, wrapped as _paint_legend wraps it."""
        fm, x, lines = self.fontMetrics(), 0, 1
        for _colour, text in self._legend_items():
            w = SWATCH + 6 + fm.horizontalAdvance(text)
            if x + w > width and x > 0:
                x, lines = 0, lines + 1
            x += w + LEGEND_GAP
        return lines

    def total(self) -> float:
        return sum(s.value for s in self.segments)

    def paintEvent(self, _event) -> None:  # noqa: N802
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        scale_max = max(self.total(), self.capacity, 1.0)
        bar = QRectF(0.5, 0.5, self.width() - 1.0, BAR_H)
        p.setPen(pal.color(QPalette.ColorRole.Mid))
        p.setBrush(pal.color(QPalette.ColorRole.Base))
        p.drawRoundedRect(bar, 4, 4)
        x = bar.left()
        for s in self.segments:
            w = bar.width() * s.value / scale_max
            if w <= 0:
                continue
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(s.colour if not s.hatched else s.colour.lighter(130))
            seg = QRectF(x, bar.top() + 1, w, bar.height() - 2)
            p.drawRect(seg)
            if s.hatched:
                p.setBrush(QBrush(s.colour.darker(130), Qt.BrushStyle.BDiagPattern))
                p.drawRect(seg)
            x += w
        if self.capacity > 0:
            cx = bar.left() + bar.width() * self.capacity / scale_max
            p.setPen(QColor("#f85149"))
            p.drawLine(int(cx) - 1, 0, int(cx) - 1, BAR_H + 4)
        self._paint_legend(p, BAR_H + 8)

    def _paint_legend(self, p: QPainter, top: int) -> None:
        fm = self.fontMetrics()
        x, y = 0, top
        items = self._legend_items()
        p.setPen(self.palette().color(QPalette.ColorRole.WindowText))
        for colour, text in items:
            w = SWATCH + 6 + fm.horizontalAdvance(text)
            if x + w > self.width() and x > 0:
                x, y = 0, y + fm.height() + 6
            p.fillRect(QRectF(x, y + (fm.height() - SWATCH) / 2, SWATCH, SWATCH), colour)
            p.drawText(int(x + SWATCH + 6), int(y + fm.ascent()), text)
            x += w + LEGEND_GAP
