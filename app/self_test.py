"""`ggstation gui --self-test`: load → chat → server → one HTTP request → stop, one summary line."""

from __future__ import annotations

import json
import sys
import time
import urllib.request

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication

from .dto import LoadParams, SamplingSettings, ServerSettings
from .engine_api import ServerHandle, SessionApi
from .machine import free_port
from .workers import CallWorker

TIMEOUT_S = 600
PROMPT = "Say hello in five words."


def _http_get(url: str, api_key: str) -> dict:
    req = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read().decode())


class SelfTest(QObject):
    def __init__(self, window, model_path: str | None):
        super().__init__(window)
        self.window, self.ctx, self.model_path = window, window.ctx, model_path
        self.exit_code = 1
        self.t0 = self._t_lap = time.perf_counter()
        self.facts: dict[str, str] = {}

    def start(self) -> None:
        QTimer.singleShot(TIMEOUT_S * 1000, lambda: self.fail(f"timed out after {TIMEOUT_S} s"))
        path = self.model_path or self._default_model()
        if not path:
            QTimer.singleShot(
                0, lambda: self.fail("no model: pass -m MODEL or pull a starter model")
            )
            return
        self.facts["model"] = path.rsplit("/", 1)[-1]
        worker = self.ctx.load(path, LoadParams(n_ctx=512, n_seq_max=2))
        worker.failed.connect(lambda msg: self.fail(f"load: {msg}"))
        self.ctx.llm_loaded.connect(self._on_loaded)

    def _lap(self) -> float:
        now = time.perf_counter()
        lap, self._t_lap = now - self._t_lap, now
        return lap

    def _default_model(self) -> str | None:
        try:
            starters = self.ctx.engine.starter_models()
        except Exception:
            return None
        return next((s.cached_path for s in starters if s.cached_path), None)

    def _on_loaded(self, session: SessionApi) -> None:
        self.facts["load"] = f"{self._lap():.1f}s"
        self.ctx.settings.sampling = SamplingSettings(temperature=0.0, seed=0, max_tokens=16)
        chat = self.window.chat
        chat.failed.connect(lambda msg: self.fail(f"chat: {msg}"))
        chat.busy_changed.connect(self._on_chat_busy)
        chat.send(PROMPT)

    def _on_chat_busy(self, busy: bool) -> None:
        if busy:
            return
        model = self.window.chat.chat_model
        reply = model.message(model.rowCount() - 1)
        if reply.role != "assistant" or not reply.stats:
            self.fail("chat: no reply")
            return
        self.facts["reply"] = f"{reply.stats.get('n_generated', 0)} tokens in {self._lap():.1f}s"
        self.ctx.server_started.connect(self._on_server_started)
        self.ctx.server_failed.connect(lambda msg: self.fail(f"server: {msg}"))
        self.ctx.start_server(ServerSettings("127.0.0.1", free_port()))

    def _on_server_started(self, handle: ServerHandle) -> None:
        worker = CallWorker(_http_get, handle.url + "/v1/models", "")
        worker.result.connect(self._on_http)
        worker.failed.connect(lambda msg: self.fail(f"http: {msg}"))
        self.ctx.pool.start(worker)

    def _on_http(self, body: dict) -> None:
        self.facts["http"] = (
            f"/v1/models {len(body.get('data', []))} model(s) in {self._lap():.1f}s"
        )
        self.ctx.stop_server()
        self.exit_code = 0
        self._finish("ok")

    def fail(self, reason: str) -> None:
        if self.exit_code == 0:
            return
        self._finish(f"FAILED ({reason.splitlines()[0]})")

    def _finish(self, verdict: str) -> None:
        facts = " ".join(f"{k}={v}" for k, v in self.facts.items())
        print(
            f"ggstation self-test {verdict}: {facts} total={time.perf_counter() - self.t0:.1f}s",
            file=sys.stdout if self.exit_code == 0 else sys.stderr,
            flush=True,
        )
        self.window.close()
        QApplication.instance().exit(self.exit_code)
