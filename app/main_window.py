"""MainWindow: layout and signal wiring only; behaviour lives in the widgets and controllers."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QFileDialog,
    QLabel,
    QMainWindow,
    QSplitter,
    QTabWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from .chat_controller import ChatController
from .context import AppContext
from .data_folder import STORE_ERRORS, describe_storage_error
from .dto import RemoteLoad
from .engine_api import ChatLlmApi, ServerHandle, SessionApi
from .gl_info import opengl_info
from .resources import icon
from .widgets.chat_pane import ChatPane
from .widgets.conversation_sidebar import ConversationSidebar
from .widgets.memory_dashboard import MemoryDashboard
from .widgets.model_picker import ModelPicker
from .widgets.notice_banner import NoticeBanner
from .widgets.sampling_panel import SamplingPanel
from .widgets.server_panel import ServerPanel
from .widgets.server_toggle import ServerToggle
from .widgets.status_bar import AppStatusBar

TAB_CHAT, TAB_MODELS, TAB_MEMORY, TAB_SERVER = range(4)
LLAMA_ONLY_FIELDS = {"top_k", "min_p", "repeat_penalty"}  # llama-server's, not OpenAI's


class MainWindow(QMainWindow):
    def __init__(self, ctx: AppContext, parent=None):
        super().__init__(parent)
        self.ctx = ctx
        self.chat = ChatController(ctx, self)
        self.setWindowTitle("ggstation")
        self.setWindowIcon(icon("ggstation"))
        self._build_toolbar()
        self._build_tabs()
        self.status = AppStatusBar(self)
        self.setStatusBar(self.status)
        self._build_shortcuts()
        self._connect_context()
        self._connect_chat()
        self._restore_state()
        self.dashboard.backends.set_backend(ctx.engine.backends())
        self.dashboard.backends.set_opengl(*opengl_info())
        ctx.refresh_devices()
        for notice in ctx.notices:  # what went wrong with the data folder at start
            self.banner.show_notice(notice)

    # building -------------------------------------------------------------------------------
    def _build_toolbar(self) -> None:
        bar = QToolBar("Main", objectName="mainToolbar", movable=False)
        bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.open_action = QAction(
            icon("open"), "Open model…", self, shortcut=QKeySequence("Ctrl+O")
        )
        self.open_action.triggered.connect(self.on_open_action_triggered)
        self.new_action = QAction(
            icon("new_chat"), "New chat", self, shortcut=QKeySequence("Ctrl+N")
        )
        self.new_action.triggered.connect(self.chat.new_conversation)
        bar.addAction(self.open_action)
        bar.addAction(self.new_action)
        spacer = QWidget()
        spacer.setSizePolicy(
            spacer.sizePolicy().Policy.Expanding, spacer.sizePolicy().Policy.Preferred
        )
        bar.addWidget(spacer)
        self.llm_label = QLabel("No model loaded", objectName="toolbarModel")
        bar.addWidget(self.llm_label)
        self.server_toggle = ServerToggle()
        self.server_toggle.toggled.connect(self.on_server_toggle_toggled)
        bar.addWidget(self.server_toggle)
        self.addToolBar(bar)

    def _build_tabs(self) -> None:
        self.tabs = QTabWidget(documentMode=True)
        self.sidebar = ConversationSidebar(self.chat.conversations)
        self.chat_pane = ChatPane(self.chat.chat_model)
        self.sampling = SamplingPanel(self.ctx.settings.presets())
        s = self.ctx.settings
        self.sampling.set_values(s.sampling, s.system_prompt, s.preset)
        self.chat_splitter = QSplitter(Qt.Orientation.Horizontal, childrenCollapsible=False)
        for w in (self.sidebar, self.chat_pane, self.sampling):
            self.chat_splitter.addWidget(w)
        self.chat_splitter.setSizes([230, 700, 270])
        self.chat_splitter.setStretchFactor(1, 1)
        self.picker = ModelPicker(self.ctx)
        self.dashboard = MemoryDashboard()
        self.server_panel = ServerPanel(self.ctx.settings.server)
        self.tabs.addTab(self.chat_splitter, icon("chat"), "Chat")
        self.tabs.addTab(self.picker, icon("models"), "Models")
        self.tabs.addTab(self.dashboard, icon("memory"), "Memory")
        self.tabs.addTab(self.server_panel, icon("server"), "Server")
        self.banner = NoticeBanner()
        central = QWidget()
        column = QVBoxLayout(central)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self.banner)  # above the tabs: seen whichever tab is open
        column.addWidget(self.tabs, 1)
        self.setCentralWidget(central)

    def _build_shortcuts(self) -> None:
        QShortcut(QKeySequence("Esc"), self, activated=self.on_escape_activated)
        QShortcut(QKeySequence("Ctrl+F"), self, activated=self.on_search_shortcut_activated)

    # wiring ---------------------------------------------------------------------------------
    def _connect_context(self) -> None:
        ctx = self.ctx
        ctx.llm_loaded.connect(self.on_ctx_llm_loaded)
        ctx.llm_unloaded.connect(self.on_ctx_llm_unloaded)
        ctx.memory_polled.connect(self.dashboard.set_figures)
        ctx.memory_polled.connect(lambda fig: self.status.set_memory(fig.rss_bytes))
        ctx.server_started.connect(self.on_ctx_server_started)
        ctx.server_stopped.connect(lambda: self._show_server(None))
        ctx.server_failed.connect(self.on_ctx_server_failed)
        ctx.request_logged.connect(self.server_panel.append_log)
        ctx.devices_found.connect(self.dashboard.set_devices)
        ctx.devices_found.connect(
            lambda devices: self.dashboard.backends.set_opengl(*opengl_info(devices))
        )
        self.dashboard.backends.refresh_requested.connect(lambda: ctx.refresh_devices(refresh=True))
        ctx.chat_llm_changed.connect(self.on_ctx_chat_llm_changed)
        ctx.remote_polled.connect(self.on_ctx_remote_polled)
        self.picker.remote.chosen.connect(self.on_remote_chosen)
        self.picker.remote.choose_failed.connect(lambda msg: self.status.showMessage(msg, 10000))
        self.server_panel.start_requested.connect(ctx.start_server)
        self.server_panel.stop_requested.connect(ctx.stop_server)

    def _connect_chat(self) -> None:
        chat, pane, side, s = self.chat, self.chat_pane, self.sidebar, self.ctx.settings
        pane.send_requested.connect(chat.send)
        pane.edit_submitted.connect(chat.edit)
        pane.stop_requested.connect(chat.stop)
        pane.regenerate_requested.connect(chat.regenerate)
        chat.busy_changed.connect(pane.set_busy)
        chat.context_changed.connect(pane.set_context)
        chat.context_changed.connect(self.status.set_context)
        chat.step_received.connect(self.dashboard.add_step)
        chat.failed.connect(lambda msg: self.status.showMessage(msg.splitlines()[0], 8000))
        chat.conversation_opened.connect(self.on_chat_conversation_opened)
        chat.storage_failed.connect(self.banner.show_notice)
        chat.edit_refused.connect(pane.resume_edit)
        chat.conversation_llm.connect(self.on_chat_conversation_llm)
        side.new_requested.connect(chat.new_conversation)
        side.conversation_selected.connect(chat.open_conversation)
        side.delete_requested.connect(chat.delete_conversation)
        side.search_changed.connect(chat.refresh_conversations)
        side.export_requested.connect(self.on_sidebar_export_requested)
        side.import_requested.connect(self.on_sidebar_import_requested)
        self.sampling.sampling_changed.connect(lambda v: setattr(s, "sampling", v))
        self.sampling.system_prompt_changed.connect(lambda v: setattr(s, "system_prompt", v))
        self.sampling.preset_combo.currentTextChanged.connect(lambda v: setattr(s, "preset", v))
        self.sampling.preset_saved.connect(lambda n, v: s.user_presets.update({n: v.as_dict()}))
        self.picker.load_started.connect(lambda: self.status.showMessage("Loading model…", 3000))

    # slots ----------------------------------------------------------------------------------
    def on_open_action_triggered(self) -> None:
        self.tabs.setCurrentIndex(TAB_MODELS)
        self.picker.open_file()

    def on_escape_activated(self) -> None:
        if self.chat.busy():
            self.chat.stop()
        else:
            self.chat_pane.cancel_edit()

    def on_search_shortcut_activated(self) -> None:
        self.tabs.setCurrentIndex(TAB_CHAT)
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()

    def on_ctx_llm_loaded(self, session: SessionApi) -> None:
        self.status.clearMessage()
        self.dashboard.set_layers(session.layers())
        self.dashboard.backends.set_backend(self.ctx.engine.backends(session.n_threads))
        self.tabs.setCurrentIndex(TAB_CHAT)
        self.chat_pane.input.setFocus()

    def on_ctx_llm_unloaded(self) -> None:
        self.dashboard.set_layers([])

    def on_ctx_chat_llm_changed(self, llm: ChatLlmApi | None) -> None:
        """The toolbar, status bar, chat pane and dashboard follow what the chat talks to."""
        remote = self.ctx.remote_endpoint
        if llm is None:
            self.llm_label.setText("No model loaded")
            self.status.set_llm(None)
            self.chat_pane.view.placeholder = "Load a model, then type a message below."
        elif remote is not None:
            self.llm_label.setText(f"{llm.name} @ {remote.label}  ")
            self.status.set_remote_llm(llm.name, remote.label)
            self.chat_pane.view.placeholder = (
                f"{llm.name} on {remote.label} is ready. Type a message below."
            )
        else:
            self.llm_label.setText(f"{llm.name}  ")
            self.status.set_llm(self.ctx.session)
            self.chat_pane.view.placeholder = f"{llm.name} is ready. Type a message below."
        server = self.picker.remote.servers.get(remote.url) if remote is not None else None
        self.dashboard.clear_remote(
            remote.label if remote is not None and not (server and server.monitored) else ""
        )
        plain = remote is not None and server is not None and server.kind == "openai"
        self.sampling.set_unsupported(
            LLAMA_ONLY_FIELDS if plain else set(),
            f"Not sent: {remote.label} speaks plain OpenAI" if remote is not None else "",
        )
        self.chat_pane.set_vision(vision_reason(llm, remote is not None))
        self.chat_pane.set_context(0, self.chat.n_ctx())
        self.chat_pane.view.viewport().update()

    def on_ctx_remote_polled(self, load: RemoteLoad) -> None:
        remote = self.ctx.remote_endpoint
        if remote is not None:
            self.dashboard.set_remote_load(load, remote.label)

    def on_remote_chosen(self, _model: str) -> None:
        self.tabs.setCurrentIndex(TAB_CHAT)
        self.chat_pane.input.setFocus()

    def on_chat_conversation_llm(self, endpoint: str, model: str) -> None:
        """Opening a conversation brings back the remote model that answered it."""
        llm = self.ctx.chat_llm
        if not endpoint or (llm is not None and llm.endpoint == endpoint and llm.name == model):
            return
        if not self.picker.remote.select(endpoint, model):
            self.status.showMessage(
                f"This conversation used {model} on {endpoint}, which is not among "
                "the remote servers.",
                8000,
            )

    def on_ctx_server_started(self, handle: ServerHandle) -> None:
        self._show_server(handle.url)
        self.server_panel.set_running(handle.url, handle.port)
        self.server_panel.append_log(f"listening on {handle.url}")

    def on_ctx_server_failed(self, message: str) -> None:
        self._show_server(None, failed=True)
        self.server_panel.show_error(message)
        self.status.showMessage(message.splitlines()[0], 8000)

    def _show_server(self, url: str | None, failed: bool = False) -> None:
        self.server_toggle.set_state(url, failed)
        self.server_panel.set_running(url)
        self.status.set_server(url)

    def on_server_toggle_toggled(self, checked: bool) -> None:
        if checked:
            self.ctx.start_server(self.server_panel.settings())
        else:
            self.ctx.stop_server()

    def on_chat_conversation_opened(self, conversation_id: int, title: str) -> None:
        self.chat_pane.set_title(title)
        self.sidebar.select(conversation_id)

    def on_sidebar_export_requested(self, conversation_id: int, fmt: str) -> None:
        store = self.ctx.store
        name = self.chat.conversations.title(conversation_id).replace("/", "-") or "conversation"
        path, _ = QFileDialog.getSaveFileName(
            self,
            "Export conversation",
            f"{name}.{fmt}",
            "Markdown (*.md)" if fmt == "md" else "JSON (*.json)",
        )
        if not path:
            return
        try:
            text = (
                store.export_markdown(conversation_id)
                if fmt == "md"
                else store.export_json(conversation_id)
            )
            Path(path).write_text(text, encoding="utf-8")
        except STORE_ERRORS as e:
            self.banner.show_notice(
                f"The conversation was not exported to {path}: {describe_storage_error(e)}."
            )

    def on_sidebar_import_requested(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import conversation", "", "JSON (*.json)")
        if path:
            self.chat.import_conversation(path)

    # state ----------------------------------------------------------------------------------
    def _restore_state(self) -> None:
        qs = self.ctx.qsettings
        for key, restore in (
            ("window/geometry", self.restoreGeometry),
            ("window/state", self.restoreState),
            ("window/chat_splitter", self.chat_splitter.restoreState),
            ("window/picker_splitter", self.picker.splitter.restoreState),
        ):
            value = qs.value(key)
            if isinstance(value, QByteArray):
                restore(value)
        if not qs.value("window/geometry"):
            self.resize(1280, 800)
        self.tabs.setCurrentIndex(int(qs.value("window/tab", TAB_CHAT)))

    def save_state(self) -> None:
        qs = self.ctx.qsettings
        qs.setValue("window/geometry", self.saveGeometry())
        qs.setValue("window/state", self.saveState())
        qs.setValue("window/chat_splitter", self.chat_splitter.saveState())
        qs.setValue("window/picker_splitter", self.picker.splitter.saveState())
        qs.setValue("window/tab", self.tabs.currentIndex())

    def closeEvent(self, event) -> None:  # noqa: N802
        self.chat.stop()
        self.save_state()
        self.ctx.shutdown()
        super().closeEvent(event)


def vision_reason(llm: ChatLlmApi | None, remote: bool) -> str:
    """Why images cannot be attached for `llm`, '' when they can. A remote server's model gets
    them (app/remote_adapter.py); whether it reads them only the server knows, and says."""
    if llm is None:
        return "Load a model to attach images."
    if remote:
        return ""
    if not llm.projector:
        return (
            f"{llm.name} reads text only: no projector file (mmproj*.gguf) was found beside "
            "the model."
        )
    return ""
