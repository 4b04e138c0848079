"""RemotePanel: remote OpenAI-compatible servers in the model picker: add, edit and remove them,
list each one's models, and choose one to chat with.

Connecting (GET /v1/models and /props) runs on a worker thread; what it finds, or why it
failed (unreachable, a refused key, not an OpenAI server), shows under the server's name and in
the status line. The list of servers (names and URLs) is kept in the settings; their keys in
the keyring (app/key_store.py).
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListView,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from ..context import AppContext
from ..dto import EndpointInfo, RemoteServerState
from ..item_models.endpoint_list_model import EndpointListModel
from ..item_models.remote_model_list_model import MODEL_ID_ROLE, RemoteModelListModel
from ..workers import RemoteConnectWorker
from .endpoint_dialog import EndpointDialog

KIND_WORDS = {
    "openai": "OpenAI-compatible",
    "llama-server": "llama-server",
    "ggstation": "ggstation",
}


class RemotePanel(QWidget):
    chosen = Signal(str)  # the model now used for the chat
    choose_failed = Signal(str)  # a conversation's remote model could not be brought back: why

    def __init__(self, ctx: AppContext, parent=None):
        super().__init__(parent)
        self.ctx = ctx
        self.endpoints = EndpointListModel(self)
        self.models = RemoteModelListModel(self)
        self.servers: dict[str, RemoteServerState] = {}  # url -> what the last connect found
        self._choose_when_connected: tuple[str, str] | None = None  # (url, model)
        self.dialog: EndpointDialog | None = None  # the last add/edit dialog opened
        self._build_ui()
        self.endpoints.set_endpoints(ctx.settings.endpoints())
        if self.endpoints.rowCount():
            self.endpoint_view.setCurrentIndex(self.endpoints.index(0))

    # building -------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        col = QVBoxLayout(self)
        col.setContentsMargins(12, 12, 6, 12)
        intro = QLabel(
            "Chat with models on other machines: another ggstation, llama-server, a Ray "
            "deployment, or any OpenAI-compatible server.",
            wordWrap=True,
            objectName="dim",
        )
        col.addWidget(intro)
        row = QHBoxLayout()
        row.addLayout(self._build_endpoint_column(), 2)
        row.addLayout(self._build_model_column(), 3)
        col.addLayout(row, 1)
        self.status = QLabel("", wordWrap=True, objectName="dim")
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        col.addWidget(self.status)

    def _build_endpoint_column(self) -> QVBoxLayout:
        col = QVBoxLayout()
        col.addWidget(QLabel("Servers"))
        self.endpoint_view = QListView()
        self.endpoint_view.setModel(self.endpoints)
        self.endpoint_view.setSpacing(2)
        self.endpoint_view.selectionModel().currentRowChanged.connect(self._on_endpoint_changed)
        col.addWidget(self.endpoint_view, 1)
        buttons = QHBoxLayout()
        self.add_button = QPushButton("Add server…", clicked=self.add_endpoint)
        self.edit_button = QPushButton("Edit…", clicked=self.edit_endpoint)
        self.remove_button = QPushButton("Remove", clicked=self.remove_endpoint)
        for b in (self.add_button, self.edit_button, self.remove_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        col.addLayout(buttons)
        return col

    def _build_model_column(self) -> QVBoxLayout:
        col = QVBoxLayout()
        self.models_label = QLabel("Models")
        col.addWidget(self.models_label)
        self.model_view = QListView()
        self.model_view.setModel(self.models)
        self.model_view.doubleClicked.connect(lambda _i: self.choose())
        col.addWidget(self.model_view, 1)
        buttons = QHBoxLayout()
        self.refresh_button = QPushButton("Refresh", clicked=self.refresh)
        self.chat_button = QPushButton(
            "Chat with this model", clicked=self.choose, objectName="primary"
        )
        buttons.addWidget(self.refresh_button)
        buttons.addStretch(1)
        buttons.addWidget(self.chat_button)
        col.addLayout(buttons)
        return col

    # endpoints ------------------------------------------------------------------------------
    def current_endpoint(self) -> EndpointInfo | None:
        index = self.endpoint_view.currentIndex()
        return self.endpoints.endpoint(index.row()) if index.isValid() else None

    def add_endpoint(self) -> None:
        self._open_dialog(None)

    def edit_endpoint(self) -> None:
        if self.current_endpoint() is not None:
            self._open_dialog(self.current_endpoint())

    def _open_dialog(self, old: EndpointInfo | None) -> None:
        """Window-modal and not blocking (open(), not exec()): no nested event loop."""
        taken = [e.url for e in self.endpoints.endpoints() if old is None or e.url != old.url]
        key = self.ctx.keys.get(old.url) if old is not None else ""
        self.dialog = EndpointDialog(
            self.ctx.engine.remote(), self.ctx.keys, taken, old, key, parent=self
        )
        self.dialog.accepted.connect(self._on_dialog_accepted)
        self.dialog.finished.connect(self.dialog.deleteLater)
        self.dialog.open()

    def _on_dialog_accepted(self) -> None:
        dialog = self.sender()
        assert isinstance(dialog, EndpointDialog) and dialog.endpoint is not None
        old = dialog.old
        if old is not None and dialog.endpoint.url != old.url:
            self.ctx.keys.delete(old.url)
            self.servers.pop(old.url, None)
        self._save(dialog.endpoint, dialog.api_key, old.url if old is not None else "")

    def _save(self, endpoint: EndpointInfo, api_key: str, old_url: str = "") -> None:
        kept = self.ctx.keys.set(endpoint.url, api_key)
        chosen, llm = self.ctx.remote_endpoint, self.ctx.chat_llm
        if chosen is not None and llm is not None and chosen.url == (old_url or endpoint.url):
            self._choose_when_connected = (endpoint.url, llm.name)  # again, with the new key or URL
        row = self.endpoints.add_or_replace(endpoint, old_url)
        self._persist()
        self.servers.pop(endpoint.url, None)  # connect again: the key may have changed
        if self.endpoint_view.currentIndex().row() == row:
            self.refresh()
        else:
            self.endpoint_view.setCurrentIndex(self.endpoints.index(row))
        if not kept:
            self._say(
                f"No system keyring: the API key of {endpoint.label} is kept for this session only."
            )

    def remove_endpoint(self) -> None:
        e = self.current_endpoint()
        if e is None:
            return
        self.endpoints.remove(self.endpoint_view.currentIndex().row())
        self.ctx.keys.delete(e.url)
        self.servers.pop(e.url, None)
        self._persist()
        if self.ctx.remote_endpoint is not None and self.ctx.remote_endpoint.url == e.url:
            self.ctx.clear_remote()
        if not self.endpoints.rowCount():
            self.models.set_models(())
            self.models_label.setText("Models")

    def _persist(self) -> None:
        self.ctx.settings.set_endpoints(self.endpoints.endpoints())
        self.ctx.save()

    # connecting -----------------------------------------------------------------------------
    def _on_endpoint_changed(self, current, _previous) -> None:
        if not current.isValid():
            return
        e = self.endpoints.endpoint(current.row())
        self.models_label.setText(f"Models on {e.label}")
        server = self.servers.get(e.url)
        if server is None:
            self.models.set_models(())
            self.refresh()
        else:
            self._show_server(e, server)

    def refresh(self) -> None:
        """Connect to the current server again: its models and what it speaks."""
        e = self.current_endpoint()
        if e is None:
            return
        self.endpoints.set_status(e.url, "connecting…")
        self._say(f"Connecting to {e.url}…")
        # bound methods, not lambdas: a slot of this QObject runs on the GUI thread (queued)
        worker = RemoteConnectWorker(self.ctx.engine.remote(), e, self.ctx.keys.get(e.url))
        worker.connected.connect(self._on_connected)
        worker.connect_failed.connect(self._on_connect_failed)
        self.ctx.pool.start(worker)

    def _on_connected(self, server: RemoteServerState) -> None:
        row = self.endpoints.row_of(server.url)
        if row < 0:  # removed (or its URL edited) while connecting
            return
        e = self.endpoints.endpoint(row)
        self.servers[e.url] = server
        n = len(server.models)
        self.endpoints.set_status(
            e.url, f"{KIND_WORDS.get(server.kind, server.kind)} · {n} model{'s' * (n != 1)}"
        )
        current = self.current_endpoint()
        if current is not None and current.url == e.url:
            self._show_server(e, server)
        wanted = self._choose_when_connected
        if wanted is not None and wanted[0] == e.url:
            self._choose_when_connected = None
            if wanted[1] in [m.id for m in server.models]:
                self.ctx.choose_remote(e, server, wanted[1])
                self.chosen.emit(wanted[1])
            else:
                self._say(f"{wanted[1]} is no longer listed by {e.label}.", error=True)
                self.choose_failed.emit(f"{wanted[1]} is no longer listed by {e.label}.")

    def _on_connect_failed(self, url: str, message: str) -> None:
        if self._choose_when_connected is not None and self._choose_when_connected[0] == url:
            self._choose_when_connected = None
            self.choose_failed.emit(message.replace("\n\n", " "))
        self.servers.pop(url, None)
        self.endpoints.set_status(url, "not connected")
        current = self.current_endpoint()
        if current is not None and current.url == url:
            self.models.set_models(())
            self._say(message, error=True)

    def _show_server(self, e: EndpointInfo, server: RemoteServerState) -> None:
        self.models.set_models(server.models)
        if server.models:
            self.model_view.setCurrentIndex(self.models.index(0))
        extras = [
            name
            for name, on in (("/slots", server.has_slots), ("/metrics", server.has_metrics))
            if on
        ]
        words = [KIND_WORDS.get(server.kind, server.kind) + " server"]
        if server.total_slots:
            words.append(f"{server.total_slots} slots")
        words.append(
            f"dashboard from {' and '.join(extras)}" if extras else "no slots or metrics to show"
        )
        if not server.models:
            words.append("it lists no models")
        if self.ctx.keys.is_session_only(e.url):
            words.append("API key kept for this session only (no system keyring)")
        self._say(" · ".join(words))

    # choosing -------------------------------------------------------------------------------
    def choose(self) -> None:
        """Chat with the selected model of the selected server."""
        e, index = self.current_endpoint(), self.model_view.currentIndex()
        server = self.servers.get(e.url) if e is not None else None
        if e is None or server is None or not index.isValid():
            self._say("Select a server and one of its models first.", error=True)
            return
        model = index.data(MODEL_ID_ROLE)
        self.ctx.choose_remote(e, server, model)
        self._say(f"Chatting with {model} on {e.label}.")
        self.chosen.emit(model)

    def select(self, url: str, model: str) -> bool:
        """Choose `model` on the server at `url` once connected again (a conversation's own
        LLM: the server is asked afresh whether it still has it); False when no server in the
        list has that URL."""
        row = self.endpoints.row_of(url)
        if row < 0:
            return False
        self._choose_when_connected = (url, model)
        if self.endpoint_view.currentIndex().row() != row:
            self.servers.pop(url, None)  # so that selecting the row connects
            self.endpoint_view.setCurrentIndex(self.endpoints.index(row))
        else:
            self.refresh()
        return True

    def _say(self, text: str, error: bool = False) -> None:
        self.status.setObjectName("error" if error else "dim")
        self.status.style().unpolish(self.status)
        self.status.style().polish(self.status)
        self.status.setText(text)
