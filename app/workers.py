"""QObject workers run on QThreads (Qt's worker-object pattern). The GUI thread never computes.

Each worker's `run()` is entered once from its thread's `started` signal and always ends with
`finished`; results and errors travel as signals, so receivers on the GUI thread get them queued.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from .context_policy import fit_to_context
from .dto import (
    EndpointInfo,
    LoadParams,
    RemoteLoad,
    RemoteServerState,
    ReplyStep,
    SamplingSettings,
)
from .engine_api import ChatLlmApi, EngineApi, RemoteApi, ReplyStream, SessionApi
from .errors import AppError, LoadCancelled, plain_error
from .machine import now_ms
from .stream_buffer import StepBuffer
from .vision_files import is_projector_file, with_projector

UNKNOWN_CTX = 1 << 30  # fit_to_context's bound for a remote model whose context size is not known


class TaskWorker(QObject):
    failed = Signal(str)
    cancelled = Signal()
    finished = Signal()

    def __init__(self) -> None:
        super().__init__()
        self._cancel = threading.Event()

    def cancel(self) -> None:
        """Thread-safe: may be called from the GUI thread while run() works."""
        self._cancel.set()

    @Slot()
    def run(self) -> None:
        try:
            self.work()
        except LoadCancelled:
            self.cancelled.emit()
        except Exception as e:  # reported to the user, never swallowed
            self.failed.emit(plain_error(e))
        finally:
            self.finished.emit()

    def work(self) -> None:
        raise NotImplementedError


_Worker = TypeVar("_Worker", bound=TaskWorker)


class WorkerPool(QObject):
    """Starts each worker on its own QThread and keeps both alive until the thread ends."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._running: dict[QThread, TaskWorker] = {}
        self._closed = False

    def start(self, worker: _Worker) -> _Worker:
        """Runs `worker` on a new thread once control is back in the event loop, so the caller
        can connect its signals after this returns: a worker that fails at once would otherwise
        emit before anyone listens, and a queued signal with no receiver is lost.

        After shutdown() it is returned unstarted, since no one would wait for its thread (a
        QThread destroyed while running aborts the process)."""
        if self._closed:
            worker.deleteLater()
            return worker
        thread = QThread()
        worker.moveToThread(thread)
        thread.started.connect(worker.run)
        worker.finished.connect(thread.quit)
        thread.finished.connect(
            self._on_thread_finished
        )  # queued: the pool lives on the GUI thread
        self._running[thread] = worker
        QTimer.singleShot(0, self, lambda: self._launch(thread, worker))
        return worker

    def _launch(self, thread: QThread, worker: TaskWorker) -> None:
        if not self._closed and self._running.get(thread) is worker:
            thread.start()

    @Slot()
    def _on_thread_finished(self) -> None:
        self._forget(self.sender())

    def _forget(self, thread: QThread) -> None:
        worker = self._running.pop(thread, None)
        if worker is not None:  # already forgotten when shutdown() got there first
            worker.deleteLater()
            thread.deleteLater()

    def busy(self) -> bool:
        return bool(self._running)

    def shutdown(self, timeout_ms: int = 5000) -> None:
        self._closed = True
        for worker in list(self._running.values()):
            worker.cancel()
        for thread in list(self._running):
            thread.quit()
            thread.wait(timeout_ms)
            self._forget(thread)


class CallWorker(TaskWorker):
    """Runs one blocking call and emits its result."""

    result = Signal(object)

    def __init__(self, fn: Callable[..., Any], *args: Any):
        super().__init__()
        self._fn, self._args = fn, args

    def work(self) -> None:
        self.result.emit(self._fn(*self._args))


class InspectWorker(TaskWorker):
    """Reads metadata of GGUF files (a folder is scanned recursively), one signal per file,
    each paired with the vision projector beside it (app/vision_files.py)."""

    file_inspected = Signal(object)  # LlmFileInfo

    def __init__(self, engine: EngineApi, paths: list[str]):
        super().__init__()
        self._engine, self._paths = engine, paths

    def work(self) -> None:
        for p in self._paths:
            path = Path(p)
            # a folder's projectors pair with its models instead of being listed as models
            files = (
                [f for f in sorted(path.rglob("*.gguf")) if not is_projector_file(str(f))]
                if path.is_dir()
                else [path]
            )
            for f in files:
                if self._cancel.is_set():
                    return
                self.file_inspected.emit(with_projector(self._engine.inspect(str(f))))


class ModelLoadWorker(TaskWorker):
    progressed = Signal(float, str)
    loaded = Signal(object)  # LlmSession

    def __init__(self, engine: EngineApi, path: str, params: LoadParams):
        super().__init__()
        self._engine, self._path, self._params = engine, path, params

    def work(self) -> None:
        session = self._engine.load(self._path, self._params, self.progressed.emit, self._cancel)
        if self._cancel.is_set():
            session.close()
            raise LoadCancelled("Loading cancelled")
        self.loaded.emit(session)


class PullWorker(TaskWorker):
    progressed = Signal(str, int, int)  # phase, done, total
    pulled = Signal(str)

    def __init__(self, engine: EngineApi, name: str):
        super().__init__()
        self._engine, self._name = engine, name

    def work(self) -> None:
        path = self._engine.pull(self._name, self.progressed.emit, self._cancel)
        if self._cancel.is_set():
            raise LoadCancelled("Download cancelled")
        self.pulled.emit(path)


class GenerationWorker(TaskWorker):
    """Fits the conversation into the context, streams one reply, and reports its stats.

    Each step goes into `buffer` (app/stream_buffer.py), which the GUI thread drains once per
    frame: no signal per token, so the GUI thread wakes at its frame rate, not the engine's.
    `replied` (or `failed`) is emitted after the last step is in the buffer.
    """

    replied = Signal(dict)  # stats + replay record

    def __init__(
        self,
        session: ChatLlmApi,
        messages: list[dict],
        sampling: SamplingSettings,
        buffer: StepBuffer,
    ):
        super().__init__()
        self._session, self._messages, self._sampling = session, messages, sampling
        self._buffer = buffer
        self._stream: ReplyStream | None = None

    def cancel(self) -> None:
        """Thread-safe; reaches the engine at once, even while the prompt is being read."""
        super().cancel()
        stream = self._stream
        if stream is not None:
            stream.cancel()

    def work(self) -> None:
        s = self._sampling
        if s.seed < 0:
            s = SamplingSettings(**{**s.as_dict(), "seed": random.randrange(1 << 31)})
        # a remote server that does not say its context size: it rejects what does not fit
        n_ctx = self._session.n_ctx_seq or UNKNOWN_CTX
        messages, dropped, max_tokens = fit_to_context(
            self._session.count_tokens, self._messages, n_ctx, s.max_tokens
        )
        s = SamplingSettings(**{**s.as_dict(), "max_tokens": max_tokens})
        t0, ttft, step = now_ms(), None, None
        self._stream = stream = self._session.generate(messages, s)
        if self._cancel.is_set():
            stream.cancel()
        put = self._buffer.put
        for step in stream:
            if ttft is None and step.text_delta:
                ttft = now_ms() - t0
            put(step)
            if step.finish_reason:
                break
        if step is None:
            if not self._cancel.is_set():
                raise AppError("The engine returned no tokens")
            step = ReplyStep("", "stopped", 0, 0)
        self.replied.emit(self._stats(step, ttft, s, dropped))

    def _stats(
        self, step: ReplyStep, ttft: float | None, s: SamplingSettings, dropped: int
    ) -> dict:
        llm = self._session
        tmpl = llm.template_source
        finish = "stopped" if self._cancel.is_set() else step.finish_reason
        # a conversation remembers which LLM answered: the file, or the server and its model id
        where = (
            {"model": llm.name, "endpoint": llm.endpoint}
            if llm.endpoint
            else {"model": Path(llm.path).name}
        )
        return {
            "n_prompt": step.n_prompt,
            "n_generated": step.n_generated,
            "n_cached": step.n_cached,
            "t_prompt_ms": round(step.t_prompt_ms, 2),
            "t_gen_ms": round(step.t_gen_ms, 2),
            "ttft_ms": round(ttft, 1) if ttft is not None else None,
            "finish_reason": finish,
            "dropped_messages": dropped,
            "replay": {
                **where,
                "model_sha256": llm.sha256,
                "template": llm.template_name,
                "template_sha256": hashlib.sha256(tmpl.encode()).hexdigest()[:16],
                "sampling": s.as_dict(),
                "n_ctx": llm.n_ctx,
            },
        }


class MemoryPoller(TaskWorker):
    """Reads the engine's memory report every `interval_s` until cancelled."""

    polled = Signal(object)  # MemoryFigures

    def __init__(self, session: SessionApi, interval_s: float = 1.0):
        super().__init__()
        self._session, self._interval = session, interval_s

    def work(self) -> None:
        while not self._cancel.is_set():
            self.polled.emit(self._session.memory())
            self._cancel.wait(self._interval)


class RemoteConnectWorker(TaskWorker):
    """Connects to a remote server (its models, what it speaks); the result or the failure
    names the server's URL, so that one panel can connect to several at once."""

    connected = Signal(object)  # RemoteServerState
    connect_failed = Signal(str, str)  # url, what went wrong in words

    def __init__(self, remote: RemoteApi, endpoint: EndpointInfo, api_key: str):
        super().__init__()
        self._remote, self._endpoint, self._key = remote, endpoint, api_key

    def work(self) -> None:
        try:
            server = self._remote.connect(self._endpoint, self._key)
        except Exception as e:  # reported in words beside the server's name
            self.connect_failed.emit(self._endpoint.url, plain_error(e))
            return
        self.connected.emit(server)


class RemotePoller(TaskWorker):
    """Polls a remote server's /slots and /metrics every `interval_s` until cancelled; a failed
    poll is reported in the RemoteLoad's `error` and the polling goes on."""

    polled = Signal(object)  # RemoteLoad

    def __init__(
        self,
        remote: RemoteApi,
        endpoint: EndpointInfo,
        api_key: str,
        server: RemoteServerState,
        interval_s: float = 1.0,
    ):
        super().__init__()
        self._remote, self._endpoint, self._key, self._server = remote, endpoint, api_key, server
        self._interval = interval_s

    def work(self) -> None:
        last: tuple[float, float] | None = None  # (time, tokens_predicted_total)
        while not self._cancel.is_set():
            t = time.monotonic()
            try:
                load = self._remote.poll(self._endpoint, self._key, self._server)
            except Exception as e:  # the server went away: say so, and try again next second
                load, last = RemoteLoad(self._endpoint.url, error=plain_error(e)), None
            total = load.tokens_predicted_total
            if total is not None:
                if last is not None and t > last[0]:
                    load = replace(load, tokens_per_s=max(total - last[1], 0.0) / (t - last[0]))
                last = (t, total)
            self.polled.emit(load)
            self._cancel.wait(self._interval)


def elapsed_since(t0: float) -> float:
    return time.perf_counter() - t0
