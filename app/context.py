"""AppContext: the one object handed to widgets: settings, engine, store, loaded LLM, server.

Typed against the Protocols in app/engine_api.py, so the real adapter and the test fake are
interchangeable here.
"""

from __future__ import annotations

import logging
import sqlite3

from PySide6.QtCore import QObject, QSettings, Signal

from .dto import (
    DeviceDesc,
    EndpointInfo,
    LoadParams,
    MemoryFigures,
    RemoteLoad,
    RemoteServerState,
    ServerSettings,
)
from .engine_api import ChatLlmApi, EngineApi, ServerHandle, SessionApi
from .key_store import KeyStore
from .machine import free_port, port_in_use
from .settings import load_settings, save_settings
from .storage import ConversationStore
from .workers import CallWorker, MemoryPoller, ModelLoadWorker, RemotePoller, WorkerPool

log = logging.getLogger(__name__)


class AppContext(QObject):
    llm_loaded = Signal(object)  # SessionApi
    llm_unloaded = Signal()
    memory_polled = Signal(object)  # MemoryFigures
    server_started = Signal(object)  # ServerHandle
    server_stopped = Signal()
    server_failed = Signal(str)
    request_logged = Signal(str)  # emitted from server threads; receivers get it queued
    devices_found = Signal(object)  # list[DeviceDesc], the CPU first
    chat_llm_changed = Signal(object)  # ChatLlmApi | None: what the chat pane now talks to
    remote_polled = Signal(object)  # RemoteLoad of the chosen remote server

    def __init__(
        self,
        engine: EngineApi,
        store: ConversationStore,
        qsettings: QSettings,
        notices: list[str] | None = None,
    ):
        super().__init__()
        self.engine, self.store, self.qsettings = engine, store, qsettings
        self.notices = notices or []  # data-folder problems found at start, for the window to show
        self.settings = load_settings(qsettings)
        self.pool = WorkerPool(self)
        self.session: SessionApi | None = None
        self.server: ServerHandle | None = None
        self.last_memory = MemoryFigures()
        self.devices: list[DeviceDesc] = []  # empty until refresh_devices() answers
        self._poller: MemoryPoller | None = None
        self.keys = KeyStore()
        # a remote model chosen for the chat; the loaded model (if any) stays loaded for the server
        self.remote_chat: ChatLlmApi | None = None
        self.remote_endpoint: EndpointInfo | None = None
        self._remote_poller: RemotePoller | None = None

    @property
    def chat_llm(self) -> ChatLlmApi | None:
        """What the chat pane talks to: the chosen remote model, else the loaded one."""
        return self.remote_chat or self.session

    # devices --------------------------------------------------------------------------------
    def refresh_devices(self, refresh: bool = False) -> None:
        """Asks the engine for its devices on a worker (a GPU probe may take a moment);
        devices_found follows. `refresh`: look again rather than reuse the first answer."""
        worker = CallWorker(self.engine.devices, refresh)
        worker.result.connect(self._on_devices)
        worker.failed.connect(lambda msg: log.warning("listing compute devices: %s", msg))
        self.pool.start(worker)

    def _on_devices(self, devices: list[DeviceDesc]) -> None:
        self.devices = list(devices)
        self.devices_found.emit(self.devices)

    def gpu_device(self) -> DeviceDesc | None:
        """The GPU that offloaded layers go to: the first usable one, as the engine picks."""
        return next((d for d in self.devices if d.is_gpu and d.available), None)

    # model ----------------------------------------------------------------------------------
    def load(self, path: str, params: LoadParams) -> ModelLoadWorker:
        """Starts loading; the caller connects progress/failure. Success replaces the session."""
        self.settings.load = params
        self.settings.add_recent(path)
        worker = ModelLoadWorker(self.engine, path, params)
        worker.loaded.connect(self._set_session)
        return self.pool.start(worker)

    def _set_session(self, session: SessionApi) -> None:
        self.unload(announce=False)
        self._stop_remote()  # a model loaded now is the one to chat with
        self.session = session
        self._poller = self.pool.start(MemoryPoller(session))
        self._poller.polled.connect(self._on_memory_polled)
        self.llm_loaded.emit(session)
        self.chat_llm_changed.emit(session)

    def _on_memory_polled(self, fig: MemoryFigures) -> None:
        self.last_memory = fig
        self.memory_polled.emit(fig)

    def unload(self, announce: bool = True) -> None:
        if self.session is None:
            return
        self.stop_server()
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        self.session.close()
        self.session = None
        self.llm_unloaded.emit()
        if announce:
            self.chat_llm_changed.emit(self.chat_llm)

    # remote servers -----------------------------------------------------------------------------
    def choose_remote(self, endpoint: EndpointInfo, server: RemoteServerState, model: str) -> None:
        """Chat with `model` on `endpoint` from now on; its slots and throughput are polled
        while it is chosen, when the server serves /slots or /metrics."""
        self._stop_remote()
        remote = self.engine.remote()
        key = self.keys.get(endpoint.url)
        self.remote_chat = remote.open_chat(endpoint, key, model, server)
        self.remote_endpoint = endpoint
        if server.monitored:
            self._remote_poller = self.pool.start(RemotePoller(remote, endpoint, key, server))
            self._remote_poller.polled.connect(self._on_remote_polled)
        self.chat_llm_changed.emit(self.remote_chat)

    def clear_remote(self) -> None:
        """Back to the loaded model (or none) for the chat."""
        if self.remote_chat is None:
            return
        self._stop_remote()
        self.chat_llm_changed.emit(self.session)

    def _stop_remote(self) -> None:
        if self._remote_poller is not None:
            self._remote_poller.cancel()
            self._remote_poller = None
        self.remote_chat = self.remote_endpoint = None

    def _on_remote_polled(self, load: RemoteLoad) -> None:
        if (
            self.remote_endpoint is not None and load.url == self.remote_endpoint.url
        ):  # not a late one
            self.remote_polled.emit(load)

    # server ---------------------------------------------------------------------------------
    def start_server(self, settings: ServerSettings) -> None:
        self.settings.server = settings
        if self.session is None:
            self.server_failed.emit("Load a model first: the server shares the loaded model.")
            return
        if settings.port and port_in_use(settings.host, settings.port):
            self.server_failed.emit(
                f"Port {settings.port} is already in use on {settings.host}. "
                f"Port {free_port(settings.host)} is free."
            )
            return
        worker = CallWorker(self.session.start_server, settings, self.request_logged.emit)
        worker.result.connect(self._on_server_started)
        worker.failed.connect(self.server_failed)
        self.pool.start(worker)

    def _on_server_started(self, handle: ServerHandle) -> None:
        self.server = handle
        self.server_started.emit(handle)

    def stop_server(self) -> None:
        if self.server is None:
            return
        handle, self.server = self.server, None
        handle.stop()
        self.server_stopped.emit()

    # lifetime -------------------------------------------------------------------------------
    def save(self) -> bool:
        """Write the settings; False (and a log line) when they could not be written."""
        if save_settings(self.qsettings, self.settings):
            return True
        log.warning(
            "settings not saved to %s: %s", self.qsettings.fileName(), self.qsettings.status().name
        )
        return False

    def shutdown(self) -> None:
        self._stop_remote()
        self.unload()
        self.pool.shutdown()
        self.save()
        try:
            self.store.close()
        except sqlite3.Error as e:  # at exit there is no one left to tell; the commits are done
            log.warning("closing the history: %s", e)
