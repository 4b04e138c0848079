"""ChatPane: the message list (model + delegate), the context gauge, the input box and the
images attached to the next message (button, drop onto the chat, paste)."""

from __future__ import annotations

from PySide6.QtCore import QBuffer, QByteArray, QMimeData, QModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QImage, QKeySequence, QPainter, QPalette, QPixmap
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListView,
    QPlainTextEdit,
    QPushButton,
    QStyleOptionViewItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..context_policy import CONTEXT_POLICY
from ..item_models.chat_list_model import ChatListModel
from ..vision_files import (
    IMAGE_FILTER,
    AttachmentError,
    ImageAttachment,
    is_image_path,
    read_image_file,
)
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
    """Ctrl+Enter sends; Enter makes a new line. A pasted or dropped image (or image file) is
    handed to the pane as an attachment instead of becoming text."""

    submitted = Signal()
    media_received = Signal(object)  # QMimeData holding images

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802
        return has_images(source) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802
        if has_images(source):
            self.media_received.emit(source)
            return
        super().insertFromMimeData(source)

    def keyPressEvent(self, event) -> None:  # noqa: N802
        ctrl = event.modifiers() & Qt.KeyboardModifier.ControlModifier
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and ctrl:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


def has_images(mime: QMimeData) -> bool:
    return mime.hasImage() or any(is_image_path(u.toLocalFile()) for u in mime.urls())


def attachments_from(mime: QMimeData) -> tuple[list[ImageAttachment], list[str]]:
    """The images in a drop or paste (image files first, else the image itself, as PNG), and
    what could not be attached, in words."""
    images, errors = [], []
    for url in mime.urls():
        path = url.toLocalFile()
        if not path:
            continue
        try:
            images.append(read_image_file(path))
        except AttachmentError as e:
            errors.append(str(e))
    if not images and not errors and mime.hasImage():
        image = QImage(mime.imageData())
        if not image.isNull():
            data = QByteArray()
            buffer = QBuffer(data)
            buffer.open(QBuffer.OpenModeFlag.WriteOnly)
            image.save(buffer, "PNG")
            images.append(ImageAttachment.from_bytes(bytes(data.data()), "pasted image.png"))
    return images, errors


class AttachmentStrip(QWidget):
    """The images attached to the next message, as thumbnails with a remove button each."""

    removed = Signal(int)  # index

    THUMB = 56

    def __init__(self, parent=None):
        super().__init__(parent)
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(0, 0, 0, 4)
        self._row.setSpacing(6)
        self._row.addStretch(1)
        self.setVisible(False)

    def set_images(self, images: list[ImageAttachment]) -> None:
        while self._row.count() > 1:  # the stretch stays last
            item = self._row.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        for i, image in enumerate(images):
            self._row.insertWidget(i, self._chip(i, image))
        self.setVisible(bool(images))

    def _chip(self, index: int, image: ImageAttachment) -> QWidget:
        chip = QWidget(objectName="attachment")
        row = QHBoxLayout(chip)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(2)
        thumb = QLabel()
        thumb.setFixedSize(self.THUMB, self.THUMB)
        thumb.setAlignment(Qt.AlignmentFlag.AlignCenter)
        pixmap = QPixmap()
        if pixmap.loadFromData(image.data):
            scaled = pixmap.scaled(
                self.THUMB,
                self.THUMB,
                Qt.AspectRatioMode.KeepAspectRatio,
                Qt.TransformationMode.SmoothTransformation,
            )
            thumb.setPixmap(scaled)
            thumb.setFixedSize(scaled.size())  # the remove button beside the picture
        else:  # sent anyway: the engine says why it cannot read it
            thumb.setText("?")
        thumb.setToolTip(f"{image.name} ({len(image.data) / 1024:.0f} KiB)")
        remove = QToolButton(text="✕", autoRaise=True)
        remove.setToolTip(f"Remove {image.name}")
        remove.clicked.connect(lambda: self.removed.emit(index))
        row.addWidget(thumb)
        row.addWidget(remove, 0, Qt.AlignmentFlag.AlignTop)
        return chip

    def count(self) -> int:
        return self._row.count() - 1


class ChatPane(QWidget):
    send_requested = Signal(str, list)  # text, [ImageAttachment]
    edit_submitted = Signal(int, str, list)  # row, new text, its images
    stop_requested = Signal()
    regenerate_requested = Signal()

    def __init__(self, chat_model: ChatListModel, parent=None):
        super().__init__(parent)
        self.chat_model = chat_model
        self._editing_row = -1
        self._follow = True
        self.pending: list[ImageAttachment] = []  # attached to the next message
        self._vision_reason = "Load a model to attach images."  # '' when images can be attached
        self.setAcceptDrops(True)  # over the message list; the input box handles its own
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self._build_header())
        layout.addWidget(self._build_view(), 1)
        layout.addWidget(self._build_input())
        self.set_busy(False)
        self.set_vision(self._vision_reason)

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
        self.attachments = AttachmentStrip()
        self.attachments.removed.connect(self.remove_attachment)
        col.addWidget(self.attachments)
        row = QHBoxLayout()
        self.input = MessageInput(placeholderText="Message the model…  (Ctrl+Enter to send)")
        self.input.setFixedHeight(self.input.fontMetrics().lineSpacing() * 3 + 18)
        self.input.submitted.connect(self.submit)
        self.input.media_received.connect(self.attach_mime)
        self.attach_button = QPushButton("Image…")
        self.attach_button.clicked.connect(self.choose_images)
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
        row.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignTop)
        row.addWidget(self.input, 1)
        row.addLayout(buttons)
        col.addLayout(row)
        return box

    # attachments ----------------------------------------------------------------------------
    def set_vision(self, reason: str) -> None:
        """'' when the chat's model reads images; else why not, shown on the attach button."""
        self._vision_reason = reason
        self.attach_button.setEnabled(not reason)
        self.attach_button.setToolTip(reason or "Attach images (or drop them here, or paste)")
        if reason and self.pending:
            self.pending = []
            self.attachments.set_images([])

    def choose_images(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach images", "", IMAGE_FILTER)
        self.attach_paths(paths)

    def attach_paths(self, paths: list[str]) -> None:
        images, errors = [], []
        for path in paths:
            try:
                images.append(read_image_file(path))
            except AttachmentError as e:
                errors.append(str(e))
        self._attach(images, errors)

    def attach_mime(self, mime: QMimeData) -> None:
        self._attach(*attachments_from(mime))

    def _attach(self, images: list[ImageAttachment], errors: list[str]) -> None:
        if images and self._vision_reason:
            self._show_notice(f"Images cannot be attached: {self._vision_reason}")
            return
        self.pending.extend(images)
        self.attachments.set_images(self.pending)
        self._show_notice("; ".join(errors))

    def remove_attachment(self, index: int) -> None:
        if 0 <= index < len(self.pending):
            del self.pending[index]
            self.attachments.set_images(self.pending)

    def dragEnterEvent(self, event) -> None:  # noqa: N802
        if has_images(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802
        self.attach_mime(event.mimeData())
        event.acceptProposedAction()

    # behaviour ------------------------------------------------------------------------------
    def submit(self) -> None:
        text = self.input.toPlainText().strip()
        if (not text and not self.pending) or not self.send_button.isEnabled():
            return
        images, self.pending = self.pending, []
        self.attachments.set_images([])
        self.input.clear()
        if self._editing_row >= 0:
            row, self._editing_row = self._editing_row, -1
            self._show_notice("")
            self.edit_submitted.emit(row, text, images)
        else:
            self.send_requested.emit(text, images)

    def begin_edit(self, row: int) -> None:
        self._editing_row = row
        message = self.chat_model.message(row)
        self.input.setPlainText(message.content)
        self.pending = list(message.images)  # resent with the edit unless removed
        self.attachments.set_images(self.pending)
        self.input.setFocus()
        self._show_notice(
            "Editing an earlier message: sending replaces it and drops everything after it."
        )
        self.cancel_edit_button.show()

    def resume_edit(self, row: int, text: str, images: list | None = None) -> None:
        """Back into editing `row` with the text the user had submitted (the edit was refused)."""
        self.begin_edit(row)
        self.input.setPlainText(text)
        if images is not None:
            self.pending = list(images)
            self.attachments.set_images(self.pending)

    def cancel_edit(self) -> None:
        if self._editing_row >= 0:
            self._editing_row = -1
            self.input.clear()
            self.pending = []
            self.attachments.set_images([])
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
