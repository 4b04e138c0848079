"""DownloadManager: Hub downloads with pause, resume and cancel, remembered across sessions.

    downloading --pause--> pausing --(worker stops: CANCELLED)--> paused --resume--> downloading
    downloading --cancel-> cancelling --(worker stops)--> partial file discarded, row removed
    downloading --(error)--> failed --resume (retry)--> downloading
    downloading --(complete)--> done: `downloaded(path)`

Pause is the engine's cancel, which keeps the partial file (the Hugging Face cache's
blobs/<sha256>.incomplete); resume is a new download() that continues from it. Every download
that is not done is written to QSettings ("hub/downloads") when it starts and when it stops, so
one that was running when the app quit (or crashed) is offered as "paused" at the next start.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable

from PySide6.QtCore import QObject, QSettings, Signal, Slot

from engine.errors import HubError

from .engine_api import HubApi
from .hub_workers import HubCallWorker, HubDownloadWorker
from .item_models.hub_download_table_model import (
    CANCELLING,
    DONE,
    DOWNLOADING,
    FAILED,
    PAUSED,
    PAUSING,
    Download,
    HubDownloadTableModel,
)
from .workers import WorkerPool

SETTINGS_KEY = "hub/downloads"
SAVE_INTERVAL_S = 2.0  # progress is written at most this often while downloading


class RateMeter:
    """Bytes per second over the last `window_s` seconds of progress reports."""

    def __init__(self, window_s: float = 3.0):
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, t: float, done: int) -> None:
        self._samples.append((t, done))
        while len(self._samples) > 2 and t - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return max(0.0, (d1 - d0) / (t1 - t0)) if t1 > t0 else 0.0


class DownloadManager(QObject):
    downloaded = Signal(str)  # path of the model's first part, in the Hugging Face cache
    failed = Signal(str, str)  # reason (HubError.AUTH, ...), message
    discarded = Signal(str, str)  # repo_id, filename: cancelled and its partial file deleted

    def __init__(
        self,
        pool: WorkerPool,
        hub: HubApi,
        qsettings: QSettings,
        token: Callable[[], str | None],
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self._pool, self._hub, self._qs, self._token = pool, hub, qsettings, token
        self.model = HubDownloadTableModel(self)
        self._requests = 0
        self._running: dict[int, tuple[Download, HubDownloadWorker]] = {}
        self._meters: dict[
            int, RateMeter | None
        ] = {}  # None until the first report (see _on_progress)
        self._discarding: dict[int, Download] = {}
        self._saved_at = 0.0
        for d in self._restore():
            self.model.add(d)

    # actions --------------------------------------------------------------------------------
    def start(self, repo_id: str, filename: str, quant: str = "", total: int = 0) -> Download:
        """Starts (or resumes) the download of a file; a running one is left alone."""
        d = self.model.find(repo_id, filename)
        if d is None:
            d = Download(repo_id, filename, quant, total, state=PAUSED)
            self.model.add(d)
        if not d.active and d.state != DONE:
            self._run(d)
        return d

    def pause(self, d: Download) -> None:
        if d.state == DOWNLOADING:
            self._stop(d, PAUSING)

    def resume(self, d: Download) -> None:
        if d.state in (PAUSED, FAILED):
            self._run(d)

    def cancel(self, d: Download) -> None:
        """Stops the download and deletes its partial file; a finished one only leaves the list."""
        if d.state in (DOWNLOADING, PAUSING):
            self._stop(d, CANCELLING)
        elif d.state in (PAUSED, FAILED):
            d.state = CANCELLING
            self.model.changed(d)
            self._discard(d)
        elif d.state == DONE:
            self.model.remove(d)

    def downloading(self) -> list[Download]:
        return [d for d in self.model.rows() if d.active]

    # workers ----------------------------------------------------------------------------------
    def _run(self, d: Download) -> None:
        self._requests += 1
        request = self._requests
        worker = HubDownloadWorker(request, self._hub, d.repo_id, d.filename, self._token())
        worker.progressed.connect(self._on_progress)
        worker.downloaded.connect(self._on_downloaded)
        worker.hub_failed.connect(self._on_failed)
        worker.finished.connect(self._on_finished)
        self._running[request] = (d, worker)
        self._meters[request] = None
        d.state, d.rate, d.message, d.earlier = DOWNLOADING, 0.0, "", False
        self.model.changed(d)
        self._save()
        self._pool.start(worker)

    def _stop(self, d: Download, state: str) -> None:
        d.state, d.rate = state, 0.0
        self.model.changed(d)
        for running, worker in self._running.values():
            if running is d:
                worker.cancel()

    def _download_of(self, request: int) -> Download | None:
        entry = self._running.get(request)
        return entry[0] if entry else None

    @Slot(int, object, object)
    def _on_progress(self, request: int, done: int, total: int) -> None:
        d = self._download_of(request)
        if d is None:
            return
        d.done, d.total = int(done), int(total)
        meter, now = self._meters.get(request), time.monotonic()
        if meter is None:  # the first report jumps over what an earlier session downloaded
            self._meters[request] = RateMeter()
        else:
            meter.add(now, d.done)
            d.rate = meter.rate() if d.state == DOWNLOADING else 0.0
        self.model.changed(d)
        if now - self._saved_at >= SAVE_INTERVAL_S:
            self._save()

    @Slot(int, str)
    def _on_downloaded(self, request: int, path: str) -> None:
        d = self._download_of(request)
        if d is None:
            return
        d.state, d.path, d.rate, d.done = DONE, path, 0.0, max(d.done, d.total)
        self.model.changed(d)
        self._save()
        self.downloaded.emit(path)

    @Slot(int, str, str)
    def _on_failed(self, request: int, reason: str, message: str) -> None:
        d = self._download_of(request)
        if d is None:
            return
        if reason == HubError.CANCELLED and d.state == CANCELLING:
            self._discard(d)
            return
        if reason == HubError.CANCELLED:
            d.state = PAUSED
        else:
            d.state, d.message = FAILED, message
            self.failed.emit(reason, message)
        d.rate = 0.0
        self.model.changed(d)
        self._save()

    @Slot()
    def _on_finished(self) -> None:
        for request, (_d, worker) in list(self._running.items()):
            if worker is self.sender():
                del self._running[request]
                self._meters.pop(request, None)

    def _discard(self, d: Download) -> None:
        self._requests += 1
        self._discarding[self._requests] = d
        worker = HubCallWorker(
            self._requests, self._hub.discard, d.repo_id, d.filename, self._token()
        )
        worker.result.connect(self._on_discarded)
        worker.hub_failed.connect(self._on_discard_failed)
        self._pool.start(worker)

    @Slot(int, object)
    def _on_discarded(self, request: int, _none: object) -> None:
        d = self._discarding.pop(request, None)
        if d is not None:
            self.model.remove(d)
            self._save()
            self.discarded.emit(d.repo_id, d.filename)

    @Slot(int, str, str)
    def _on_discard_failed(self, request: int, reason: str, message: str) -> None:
        d = self._discarding.pop(request, None)
        if d is not None:
            d.state, d.message = FAILED, f"the partial file was not deleted: {message}"
            self.model.changed(d)
            self._save()
            self.failed.emit(reason, d.message)

    # persistence ------------------------------------------------------------------------------
    def _save(self) -> None:
        self._saved_at = time.monotonic()
        records = [
            {
                "repo_id": d.repo_id,
                "filename": d.filename,
                "quant": d.quant,
                "total": d.total,
                "done": d.done,
            }
            for d in self.model.rows()
            if d.state != DONE
        ]
        self._qs.setValue(SETTINGS_KEY, json.dumps(records))
        self._qs.sync()

    def _restore(self) -> list[Download]:
        """The downloads an earlier session left unfinished; unreadable entries are skipped."""
        try:
            records = json.loads(str(self._qs.value(SETTINGS_KEY, "[]")))
        except ValueError:
            return []
        out = []
        for r in records if isinstance(records, list) else []:
            try:
                out.append(
                    Download(
                        str(r["repo_id"]),
                        str(r["filename"]),
                        str(r.get("quant", "")),
                        int(r.get("total", 0)),
                        int(r.get("done", 0)),
                        PAUSED,
                        earlier=True,
                    )
                )
            except (KeyError, TypeError, ValueError):
                continue
        return out
