"""TimelineChart: memory series (bytes, left axis) and tokens/s (right axis) over the last minutes.

The time axis follows the data: it starts shortly before the last reply's first tokens/s point
(at least MIN_WINDOW_S, at most MAX_WINDOW_S back), so a reply of a few seconds fills the chart
instead of a sliver at the right edge of a fixed window. The mouse wheel zooms to a fixed
window; a double-click goes back to following the data.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from ..format import human_bytes

WINDOW_S = 120.0  # before any reply
MIN_WINDOW_S, MAX_WINDOW_S = 10.0, 600.0
LEAD_S = 2.0  # shown before the reply's first point
ZOOM = 1.5  # per wheel step
LEFT, RIGHT, TOP, BOTTOM = 78, 56, 26, 22
GAP_S = 3.0  # a pause longer than this breaks the line (no slope drawn across idle time)


@dataclass
class Series:
    label: str
    colour: QColor
    right_axis: bool = False  # tokens/s instead of bytes
    points: deque = field(default_factory=lambda: deque(maxlen=2000))  # (t, value)


class TimelineChart(QWidget):
    def __init__(self, series: list[Series], parent=None):
        super().__init__(parent)
        self.series = {s.label: s for s in series}
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMinimumHeight(160)
        self.window_s: float | None = None  # None: follow the data; else a fixed zoom
        self.setToolTip(
            "Mouse wheel: zoom the time axis. Double-click: follow the last reply again."
        )

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(600, 220)

    def add(self, label: str, value: float, t: float | None = None) -> None:
        self.series[label].points.append((time.monotonic() if t is None else t, float(value)))
        self.update()

    def clear(self) -> None:
        for s in self.series.values():
            s.points.clear()
        self.update()

    def span_s(self, now: float) -> float:
        """Seconds the time axis covers, ending now."""
        if self.window_s is not None:
            return self.window_s
        points = [p for s in self.series.values() if s.right_axis for p in s.points]
        if not points:
            return WINDOW_S
        points.sort()
        start = points[-1][0]
        for t, _v in reversed(points):  # back to the start of the last burst: the last reply
            if start - t > GAP_S:
                break
            start = t
        return min(max(now - start + LEAD_S, MIN_WINDOW_S), MAX_WINDOW_S)

    def wheelEvent(self, event) -> None:  # noqa: N802
        span = self.span_s(time.monotonic())
        steps = event.angleDelta().y() / 120.0
        self.window_s = min(max(span / ZOOM**steps, MIN_WINDOW_S / 2), MAX_WINDOW_S)
        self.update()

    def mouseDoubleClickEvent(self, _event) -> None:  # noqa: N802
        self.window_s = None
        self.update()

    def _max(self, right: bool, t0: float) -> float:
        vals = [
            v for s in self.series.values() if s.right_axis == right for t, v in s.points if t >= t0
        ]
        return max(vals, default=0.0) * 1.15 or 1.0

    def paintEvent(self, _event) -> None:  # noqa: N802
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        plot = QRectF(
            LEFT, TOP, max(self.width() - LEFT - RIGHT, 10), max(self.height() - TOP - BOTTOM, 10)
        )
        p.fillRect(plot, pal.color(QPalette.ColorRole.Base))
        now = time.monotonic()
        span = self.span_s(now)
        t0 = now - span
        y_max, r_max = self._max(False, t0), self._max(True, t0)
        self._paint_grid(p, plot, y_max, r_max, span, self._has_bytes())
        for s in self.series.values():
            self._paint_series(p, plot, s, t0, span, r_max if s.right_axis else y_max)
        self._paint_legend(p)

    def _has_bytes(self) -> bool:
        """Any point on the left (bytes) axis: without one (no local model) it has no scale."""
        return any(s.points for s in self.series.values() if not s.right_axis)

    def _paint_grid(
        self,
        p: QPainter,
        plot: QRectF,
        y_max: float,
        r_max: float,
        span: float,
        left_labels: bool = True,
    ) -> None:
        pal, fm = self.palette(), self.fontMetrics()
        grid = QPen(pal.color(QPalette.ColorRole.Midlight), 1)
        text = pal.color(QPalette.ColorRole.PlaceholderText)
        for i in range(5):
            y = plot.bottom() - plot.height() * i / 4
            p.setPen(grid)
            p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
            p.setPen(text)
            if left_labels:
                p.drawText(
                    QRectF(0, y - 9, LEFT - 6, 18),
                    Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                    human_bytes(y_max * i / 4),
                )
            p.drawText(
                QRectF(plot.right() + 6, y - 9, RIGHT - 6, 18),
                Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                _tick(r_max * i / 4),
            )
        p.drawText(
            QRectF(plot.left(), plot.bottom() + 2, plot.width(), BOTTOM),
            Qt.AlignmentFlag.AlignLeft,
            f"−{span:.0f} s",
        )
        p.drawText(
            QRectF(plot.left(), plot.bottom() + 2, plot.width(), BOTTOM),
            Qt.AlignmentFlag.AlignRight,
            "now",
        )
        p.drawText(
            QRectF(plot.right() + 6, TOP - fm.height() - 4, RIGHT, fm.height()),
            Qt.AlignmentFlag.AlignLeft,
            "tok/s",
        )
        p.setPen(pal.color(QPalette.ColorRole.Mid))
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawRect(plot)

    def _paint_series(
        self, p: QPainter, plot: QRectF, s: Series, t0: float, span: float, y_max: float
    ) -> None:
        pts = [(t, v) for t, v in s.points if t >= t0 - 1]
        if not pts:
            return
        path, prev_t = QPainterPath(), None
        for t, v in pts:
            x = plot.left() + plot.width() * max(t - t0, 0) / span
            y = plot.bottom() - plot.height() * min(v / y_max, 1.0)
            if prev_t is None or t - prev_t > GAP_S:
                path.moveTo(x, y)
            else:
                path.lineTo(x, y)
            prev_t = t
        pen = QPen(s.colour, 2)
        if s.right_axis:
            pen.setStyle(Qt.PenStyle.DashLine)
        p.setPen(pen)
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawPath(path)

    def _paint_legend(self, p: QPainter) -> None:
        fm, x = self.fontMetrics(), LEFT
        p.setPen(self.palette().color(QPalette.ColorRole.WindowText))
        for s in self.series.values():
            p.fillRect(QRectF(x, 6 + (fm.height() - 10) / 2, 10, 10), s.colour)
            label = s.label + (" (right axis)" if s.right_axis else "")
            p.drawText(int(x + 16), 6 + fm.ascent(), label)
            x += 16 + fm.horizontalAdvance(label) + 18


def _tick(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == 0 else f"{value:.1f}"
