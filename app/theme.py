"""Light and dark palettes on the Fusion style, following the system colour scheme by default."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from .resources import stylesheet

ACCENT = QColor("#3d7eff")

_DARK = {
    QPalette.ColorRole.Window: "#1e1f22",
    QPalette.ColorRole.WindowText: "#e6e6e6",
    QPalette.ColorRole.Base: "#25262a",
    QPalette.ColorRole.AlternateBase: "#2c2e33",
    QPalette.ColorRole.Text: "#e6e6e6",
    QPalette.ColorRole.Button: "#2c2e33",
    QPalette.ColorRole.ButtonText: "#e6e6e6",
    QPalette.ColorRole.ToolTipBase: "#2c2e33",
    QPalette.ColorRole.ToolTipText: "#e6e6e6",
    QPalette.ColorRole.PlaceholderText: "#8a8d93",
    QPalette.ColorRole.Mid: "#3a3c42",
    QPalette.ColorRole.Midlight: "#34363b",
    QPalette.ColorRole.Dark: "#151618",
    QPalette.ColorRole.Light: "#3f4147",
    QPalette.ColorRole.Highlight: ACCENT.name(),
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.Link: "#7aa7ff",
}
_LIGHT = {
    QPalette.ColorRole.Window: "#f4f5f7",
    QPalette.ColorRole.WindowText: "#1d1f23",
    QPalette.ColorRole.Base: "#ffffff",
    QPalette.ColorRole.AlternateBase: "#f0f2f5",
    QPalette.ColorRole.Text: "#1d1f23",
    QPalette.ColorRole.Button: "#ffffff",
    QPalette.ColorRole.ButtonText: "#1d1f23",
    QPalette.ColorRole.ToolTipBase: "#ffffff",
    QPalette.ColorRole.ToolTipText: "#1d1f23",
    QPalette.ColorRole.PlaceholderText: "#80848c",
    QPalette.ColorRole.Mid: "#c9ccd2",
    QPalette.ColorRole.Midlight: "#e3e5e9",
    QPalette.ColorRole.Dark: "#a0a4ab",
    QPalette.ColorRole.Light: "#ffffff",
    QPalette.ColorRole.Highlight: ACCENT.name(),
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.Link: "#2a62d4",
}


def system_is_dark() -> bool:
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def apply_theme(app: QApplication, mode: str = "system") -> None:
    """mode: 'system' | 'light' | 'dark'."""
    dark = system_is_dark() if mode == "system" else mode == "dark"
    app.setStyle("Fusion")
    palette = QPalette()
    for role, colour in (_DARK if dark else _LIGHT).items():
        palette.setColor(role, QColor(colour))
    for role in (
        QPalette.ColorRole.Text,
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.ButtonText,
    ):
        palette.setColor(
            QPalette.ColorGroup.Disabled, role, QColor("#6c6f75" if dark else "#a4a7ad")
        )
    app.setPalette(palette)
    app.setStyleSheet(stylesheet())


def follow_system(app: QApplication, mode_getter) -> None:
    """Re-apply the theme when the system switches between light and dark."""
    hints = QGuiApplication.styleHints()
    hints.colorSchemeChanged.connect(lambda _s: mode_getter() == "system" and apply_theme(app))


def mix(a: QColor, b: QColor, t: float) -> QColor:
    """Blend a toward b by t (0..1)."""
    return QColor(
        round(a.red() + (b.red() - a.red()) * t),
        round(a.green() + (b.green() - a.green()) * t),
        round(a.blue() + (b.blue() - a.blue()) * t),
    )
