"""Workers for Hugging Face Hub calls (app/engine_api.py HubApi), on the WorkerPool's QThreads.

A Hub failure keeps its reason (AUTH, OFFLINE, CANCELLED, ...), which the Discover panel acts
on; every result carries the request number the caller gave, so that the caller can drop the
answer to a question it no longer asks (an older search that returns after a newer one).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Signal

from engine.errors import HubError

from .engine_api import HubApi
from .errors import plain_error
from .workers import TaskWorker

OTHER = "error"  # the reason given for a failure that is not a HubError


class HubWorker(TaskWorker):
    """A TaskWorker whose failures say why: hub_failed(request, reason, message).

    Subclasses implement call(). (TaskWorker.run is not overridden: PySide6 6.11 then invokes
    the override, connected to QThread.started, on the GUI thread.)"""

    hub_failed = Signal(int, str, str)

    def __init__(self, request: int = 0):
        super().__init__()
        self.request = request

    def work(self) -> None:
        try:
            self.call()
        except HubError as e:
            self.hub_failed.emit(self.request, e.reason, str(e))
        except Exception as e:  # reported to the user, never swallowed
            self.hub_failed.emit(self.request, OTHER, plain_error(e))

    def call(self) -> None:
        raise NotImplementedError


class HubCallWorker(HubWorker):
    """One blocking Hub call: result(request, value)."""

    result = Signal(int, object)

    def __init__(self, request: int, fn: Callable[..., Any], *args: Any):
        super().__init__(request)
        self._fn, self._args = fn, args

    def call(self) -> None:
        self.result.emit(self.request, self._fn(*self._args))


class HubDownloadWorker(HubWorker):
    """One download: progressed(request, done, total) at most every EMIT_INTERVAL_S, then
    downloaded(request, path); cancel() stops it within a chunk, keeping the partial file."""

    EMIT_INTERVAL_S = 0.1

    progressed = Signal(int, object, object)  # bytes: may pass 2**31
    downloaded = Signal(int, str)

    def __init__(self, request: int, hub: HubApi, repo_id: str, filename: str, token: str | None):
        super().__init__(request)
        self._hub, self._repo_id, self._filename, self._token = hub, repo_id, filename, token
        self._emitted_at = 0.0

    def call(self) -> None:
        path = self._hub.download(
            self._repo_id, self._filename, self._token, self._progress, self._cancel
        )
        self.downloaded.emit(self.request, path)

    def _progress(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done >= total or now - self._emitted_at >= self.EMIT_INTERVAL_S:
            self._emitted_at = now
            self.progressed.emit(self.request, done, total)
