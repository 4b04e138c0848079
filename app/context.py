"""AppContext: the one object handed to widgets: settings, engine, store, loaded LLM, server.

Typed against the Protocols in app/engine_api.py, so the real adapter and the test fake are
interchangeable here.
"""

from __future__ import annotations

import logging
import sqlite3

from PySide6.QtCore import QObject, QSettings, Signal

from .dto import DeviceDesc, LoadParams, MemoryFigures, ServerSettings
from .engine_api import EngineApi, ServerHandle, SessionApi
from .machine import free_port, port_in_use
from .settings import load_settings, save_settings
from .storage import ConversationStore
from .workers import CallWorker, MemoryPoller, ModelLoadWorker, WorkerPool

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

    def __init__(self, engine: EngineApi, store: ConversationStore, qsettings: QSettings,
                 notices: list[str] | None = None):
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
        self.unload()
        self.session = session
        self._poller = self.pool.start(MemoryPoller(session))
        self._poller.polled.connect(self._on_memory_polled)
        self.llm_loaded.emit(session)

    def _on_memory_polled(self, fig: MemoryFigures) -> None:
        self.last_memory = fig
        self.memory_polled.emit(fig)

    def unload(self) -> None:
        if self.session is None:
            return
        self.stop_server()
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        self.session.close()
        self.session = None
        self.llm_unloaded.emit()

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
        log.warning("settings not saved to %s: %s", self.qsettings.fileName(), self.qsettings.status().name)
        return False

    def shutdown(self) -> None:
        self.unload()
        self.pool.shutdown()
        self.save()
        try:
            self.store.close()
        except sqlite3.Error as e:  # at exit there is no one left to tell; the commits are done
            log.warning("closing the history: %s", e)
