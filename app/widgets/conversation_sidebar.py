"""ConversationSidebar: new chat, import, search, and the conversation list with rename/delete/export."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLineEdit,
    QListView,
    QMenu,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from ..item_models.conversation_list_model import ID_ROLE, ConversationListModel


class ConversationSidebar(QWidget):
    new_requested = Signal()
    conversation_selected = Signal(int)
    delete_requested = Signal(int)
    export_requested = Signal(int, str)  # id, "md" | "json"
    import_requested = Signal()
    search_changed = Signal(str)

    def __init__(self, conversations: ConversationListModel, parent=None):
        super().__init__(parent)
        self.conversations = conversations
        self._current_id = 0
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 12, 6, 10)
        layout.setSpacing(8)
        self.new_button = QPushButton("New chat", objectName="primary")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.clicked.connect(self.new_requested)
        self.import_button = QPushButton("Import…", toolTip="Add a conversation exported as JSON")
        self.import_button.clicked.connect(self.import_requested)
        buttons = QHBoxLayout()
        buttons.addWidget(self.new_button, 1)
        buttons.addWidget(self.import_button)
        self.search = QLineEdit(
            placeholderText="Search conversations (Ctrl+F)", clearButtonEnabled=True
        )
        self.search.textChanged.connect(self.search_changed)
        layout.addLayout(buttons)
        layout.addWidget(self.search)
        layout.addWidget(self._build_list(), 1)
        # after setModel(): the view's own reset handler clears the current row first
        conversations.modelReset.connect(lambda: self.select(self._current_id))

    def _build_list(self) -> QListView:
        self.list = QListView()
        self.list.setModel(self.conversations)
        self.list.setEditTriggers(
            QAbstractItemView.EditTrigger.EditKeyPressed
            | QAbstractItemView.EditTrigger.DoubleClicked
        )
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._show_menu)
        self.list.clicked.connect(lambda idx: self.conversation_selected.emit(idx.data(ID_ROLE)))
        self.list.setFrameShape(QListView.Shape.NoFrame)
        self.list.setUniformItemSizes(True)
        self.list.setWordWrap(False)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        return self.list

    def select(self, conversation_id: int) -> None:
        self._current_id = conversation_id
        row = self.conversations.row_of(conversation_id)
        if row >= 0:
            self.list.setCurrentIndex(self.conversations.index(row))
        else:
            self.list.clearSelection()

    def _show_menu(self, pos: QPoint) -> None:
        idx = self.list.indexAt(pos)
        if not idx.isValid():
            return
        cid = idx.data(ID_ROLE)
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.edit(idx))
        menu.addAction("Export as Markdown…", lambda: self.export_requested.emit(cid, "md"))
        menu.addAction("Export as JSON…", lambda: self.export_requested.emit(cid, "json"))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.delete_requested.emit(cid))
        menu.exec(self.list.viewport().mapToGlobal(pos))
