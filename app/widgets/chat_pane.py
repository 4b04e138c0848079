"""ChatPane: the message list (model + delegate), the context gauge and the input box."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QPainter, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QListView,
    QPlainTextEdit,
    QPushButton,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from ..context_policy import CONTEXT_POLICY
from ..item_models.chat_list_model import ChatListModel
from .chat_delegate import ChatDelegate
from .context_gauge import WARN_AT, ContextGauge


class ChatView(QListView):
    """A list view that shows a hint when empty and follows the stream when scrolled to the end."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.placeholder = "Load a model, then type a message below."
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setMouseTracking(True)
        self.setFrameShape(QListView.Shape.NoFrame)
        self.verticalScrollBar().setSingleStep(24)

    def paintEvent(self, event) -> None:  # noqa: N802
        super().paintEvent(event)
        if self.model() is not None and self.model().rowCount() == 0:
            p = QPainter(self.viewport())
            p.setPen(self.palette().color(QPalette.ColorRole.PlaceholderText))
            p.drawText(self.viewport().rect(), Qt.AlignmentFlag.AlignCenter, self.placeholder)

    def at_bottom(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 40

    def mouseMoveEvent(self, event) -> None:  # noqa: N802
        row = self.indexAt(event.position().toPoint()).row()
        delegate = self.itemDelegate()
        if isinstance(delegate, ChatDelegate) and delegate.hover_row != row:
            delegate.hover_row = row
            self.viewport().update()
        super().mouseMoveEvent(event)


class MessageInput(QPlainTextEdit):
    """Ctrl+Enter sends; Enter makes a new line."""

    submitted = Signal()

    def keyPressEvent(self, event) -> None:  # noqa: N802
        ctrl = event.modifiers() & Qt.KeyboardModifier.ControlModifier
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and ctrl:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class ChatPane(QWidget):
    send_requested = Signal(str)
    edit_submitted = Signal(int, str)  # row, new text
    stop_requested = Signal()
    regenerate_requested = Signal()

    def __init__(self, chat_model: ChatListModel, parent=None):
        super().__init__(parent)
        self.chat_model = chat_model
        self._editing_row = -1
        self._follow = True
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self._build_header())
        layout.addWidget(self._build_view(), 1)
        layout.addWidget(self._build_input())
        self.set_busy(False)

    # building -------------------------------------------------------------------------------
    def _build_header(self) -> QWidget:
        header = QWidget(objectName="chatHeader")
        row = QHBoxLayout(header)
        row.setContentsMargins(16, 8, 12, 8)
        self.title_label = QLabel("New chat", objectName="chatTitle")
        self.gauge = ContextGauge()
        row.addWidget(self.title_label, 1)
        row.addWidget(QLabel("Context"))
        row.addWidget(self.gauge)
        return header

    def _build_view(self) -> QWidget:
        self.view = ChatView()
        self.delegate = ChatDelegate(self.view)
        self.view.setModel(self.chat_model)
        self.view.setItemDelegate(self.delegate)
        self.delegate.copy_requested.connect(self._copy_row)
        self.delegate.code_copy_requested.connect(
            lambda text: QGuiApplication.clipboard().setText(text)
        )
        self.delegate.edit_requested.connect(self.begin_edit)
        self.delegate.regenerate_requested.connect(lambda _row: self.regenerate_requested.emit())
        self._heights: dict[int, int] = {}  # row -> the height the view was last told of
        for change in (
            self.chat_model.modelReset,
            self.chat_model.rowsInserted,
            self.chat_model.rowsRemoved,
        ):
            change.connect(lambda *_: self._heights.clear())
        self.chat_model.dataChanged.connect(self._on_rows_changed)
        self.chat_model.rowsInserted.connect(lambda *_: self._scroll_if_following(force=True))
        self.view.verticalScrollBar().valueChanged.connect(self._on_scrolled)
        return self.view

    def _build_input(self) -> QWidget:
        box = QWidget(objectName="inputBar")
        col = QVBoxLayout(box)
        col.setContentsMargins(12, 8, 12, 8)
        col.setSpacing(4)
        notice_row = QHBoxLayout()
        self.notice = QLabel(wordWrap=True, objectName="notice")
        self.cancel_edit_button = QPushButton("Cancel edit", clicked=self.cancel_edit)
        self.notice.hide()
        self.cancel_edit_button.hide()
        notice_row.addWidget(self.notice, 1)
        notice_row.addWidget(self.cancel_edit_button)
        col.addLayout(notice_row)
        row = QHBoxLayout()
        self.input = MessageInput(placeholderText="Message the model…  (Ctrl+Enter to send)")
        self.input.setFixedHeight(self.input.fontMetrics().lineSpacing() * 3 + 18)
        self.input.submitted.connect(self.submit)
        self.send_button = QPushButton("Send", objectName="primary")
        shortcut = QKeySequence("Ctrl+Return").toString(QKeySequence.SequenceFormat.NativeText)
        self.send_button.setToolTip(f"Send ({shortcut})")
        self.send_button.clicked.connect(self.submit)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.stop_button.clicked.connect(self.stop_requested)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        row.addWidget(self.input, 1)
        row.addLayout(buttons)
        col.addLayout(row)
        return box

    # behaviour ------------------------------------------------------------------------------
    def submit(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or not self.send_button.isEnabled():
            return
        self.input.clear()
        if self._editing_row >= 0:
            row, self._editing_row = self._editing_row, -1
            self._show_notice("")
            self.edit_submitted.emit(row, text)
        else:
            self.send_requested.emit(text)

    def begin_edit(self, row: int) -> None:
        self._editing_row = row
        self.input.setPlainText(self.chat_model.message(row).content)
        self.input.setFocus()
        self._show_notice(
            "Editing an earlier message: sending replaces it and drops everything after it."
        )
        self.cancel_edit_button.show()

    def resume_edit(self, row: int, text: str) -> None:
        """Back into editing `row` with the text the user had submitted (the edit was refused)."""
        self.begin_edit(row)
        self.input.setPlainText(text)

    def cancel_edit(self) -> None:
        if self._editing_row >= 0:
            self._editing_row = -1
            self.input.clear()
            self._show_notice("")

    def is_editing(self) -> bool:
        return self._editing_row >= 0

    def set_busy(self, busy: bool) -> None:
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)

    def set_title(self, title: str) -> None:
        self.title_label.setText(title)

    def set_context(self, used: int, n_ctx: int) -> None:
        self.gauge.set_usage(used, n_ctx)
        if n_ctx and used / n_ctx >= WARN_AT and self._editing_row < 0:
            self._show_notice(f"Context {100 * used / n_ctx:.0f}% full. {CONTEXT_POLICY}")
        elif self._editing_row < 0:
            self._show_notice("")

    def _show_notice(self, text: str) -> None:
        self.notice.setText(text)
        self.notice.setVisible(bool(text))
        self.cancel_edit_button.setVisible(self._editing_row >= 0)

    def _copy_row(self, row: int) -> None:
        QGuiApplication.clipboard().setText(self.chat_model.message(row).content)

    def _on_rows_changed(self, top: QModelIndex, bottom: QModelIndex, _roles=()) -> None:
        """Relayout only rows whose height changed: a streaming reply changes every frame but
        needs a new line only every few frames, and a relayout asks the delegate for every
        row's size. The view repaints a changed row by itself."""
        grown = False
        for row in range(top.row(), bottom.row() + 1):
            index = self.chat_model.index(row)
            height = self._row_height(index)
            if self._heights.get(row) != height:
                self._heights[row] = height
                self.delegate.sizeHintChanged.emit(index)
                grown = True
        if grown:
            self._scroll_if_following()

    def _row_height(self, index: QModelIndex) -> int:
        option = QStyleOptionViewItem()
        option.rect = self.view.visualRect(index)
        option.font, option.palette, option.fontMetrics = (
            self.view.font(),
            self.view.palette(),
            self.view.fontMetrics(),
        )
        return self.delegate.sizeHint(option, index).height()

    def _on_scrolled(self, _value: int) -> None:
        self._follow = self.view.at_bottom()

    def _scroll_if_following(self, force: bool = False) -> None:
        if force or self._follow:
            self._follow = True
            QTimer.singleShot(0, self.view.scrollToBottom)  # after the delayed relayout
