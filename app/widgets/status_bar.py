"""AppStatusBar: loaded LLM, threads, context use and server state, always visible."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QStatusBar

from ..engine_api import SessionApi
from ..format import human_bytes


class AppStatusBar(QStatusBar):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.llm_label = QLabel("No model loaded")
        self.threads_label = QLabel("")
        self.context_label = QLabel("")
        self.memory_label = QLabel("")
        self.server_label = QLabel("Server off")
        self.addWidget(self.llm_label, 1)
        for w in (self.threads_label, self.context_label, self.memory_label, self.server_label):
            self.addPermanentWidget(w)

    def set_llm(self, session: SessionApi | None) -> None:
        if session is None:
            self.llm_label.setText("No model loaded")
            self.threads_label.setText("")
            self.context_label.setText("")
            return
        self.llm_label.setText(f"{session.name} · {session.arch}")
        self.threads_label.setText(f"{session.n_threads} threads")

    def set_remote_llm(self, name: str, where: str) -> None:
        self.llm_label.setText(f"{name} · on {where}")
        self.threads_label.setText("")

    def set_context(self, used: int, n_ctx: int) -> None:
        self.context_label.setText(f"context {used:,} / {n_ctx:,}" if n_ctx else "")

    def set_memory(self, rss_bytes: int) -> None:
        self.memory_label.setText(f"RSS {human_bytes(rss_bytes)}")

    def set_server(self, url: str | None) -> None:
        self.server_label.setText(f"Server {url}" if url else "Server off")
