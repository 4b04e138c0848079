"""NoticeBanner: a strip above the tabs for a problem the user must read, until dismissed.

Not a modal dialog: that would stop the window at start (and the tests) before anything shows.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QStyle, QToolButton

MAX_LINES = 4

# amber at low opacity reads as a warning on both the light and the dark palette
_STYLE = """
QFrame#noticeBanner { background: rgba(240, 173, 78, 0.20); border: 1px solid rgba(214, 144, 40, 0.75);
                      border-radius: 6px; margin: 6px 8px 2px 8px; }
QFrame#noticeBanner QLabel { background: transparent; border: none; }
QFrame#noticeBanner QToolButton { border: none; padding: 2px 6px; }
"""


class NoticeBanner(QFrame):
    def __init__(self, parent=None):
        super().__init__(parent, objectName="noticeBanner")
        self.setStyleSheet(_STYLE)
        icon = QLabel()
        icon.setPixmap(
            self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxWarning).pixmap(20, 20)
        )
        icon.setAlignment(Qt.AlignmentFlag.AlignTop)
        self.label = QLabel(
            wordWrap=True,
            textFormat=Qt.TextFormat.PlainText,
            textInteractionFlags=Qt.TextInteractionFlag.TextSelectableByMouse,
        )
        self.close_button = QToolButton(text="Dismiss", toolTip="Hide this message")
        self.close_button.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 8, 6, 8)
        layout.setSpacing(10)
        layout.addWidget(icon)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.hide()

    def show_notice(self, text: str) -> None:
        """Add `text` under what is shown, so a later problem does not hide an earlier one."""
        lines = [] if self.isHidden() else self.label.text().splitlines()
        lines = [line for line in lines if line != text] + [text]
        self.label.setText("\n".join(lines[-MAX_LINES:]))
        self.show()

    def text(self) -> str:
        return self.label.text()
