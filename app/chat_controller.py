"""ChatController: send / stop / regenerate / edit, persisting every message as it is sent."""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, Signal

from .context import AppContext
from .dto import ReplyStep
from .engine_api import SessionApi
from .item_models.chat_list_model import ChatListModel
from .item_models.conversation_list_model import ConversationListModel
from .storage import Message
from .workers import GenerationWorker

SAVE_INTERVAL_S = 1.0  # a streaming reply is rewritten in the store at most this often


class ChatController(QObject):
    busy_changed = Signal(bool)
    step_received = Signal(object)  # ReplyStep, for the dashboard's tokens/s
    context_changed = Signal(int, int)  # tokens used, tokens available to the chat
    failed = Signal(str)
    conversation_opened = Signal(int, str)  # id, title

    def __init__(self, ctx: AppContext, parent=None):
        super().__init__(parent)
        self.ctx = ctx
        self.chat_model = ChatListModel(self)
        self.conversations = ConversationListModel(self)
        self.conversations.title_edited.connect(self._on_title_edited)
        self.conversation_id = 0
        self._worker: GenerationWorker | None = None
        self._reply_id, self._saved_at = 0, 0.0
        self._search = ""
        self.refresh_conversations()

    # conversations ----------------------------------------------------------------------------
    def refresh_conversations(self, search: str | None = None) -> None:
        self._search = self._search if search is None else search
        self.conversations.set_conversations(self.ctx.store.list(self._search))

    def new_conversation(self) -> None:
        self.conversation_id = 0
        self.chat_model.set_messages([])
        self.conversation_opened.emit(0, "New chat")
        self.context_changed.emit(0, self.n_ctx())

    def open_conversation(self, conversation_id: int) -> None:
        if self.busy() or conversation_id == self.conversation_id:
            return
        self.conversation_id = conversation_id
        messages = self.ctx.store.messages(conversation_id)
        self.chat_model.set_messages(messages)
        self.conversation_opened.emit(conversation_id, self.ctx.store.title(conversation_id))
        last = next((m.stats for m in reversed(messages) if m.stats), {})
        self.context_changed.emit(last.get("n_prompt", 0) + last.get("n_generated", 0), self.n_ctx())

    def _on_title_edited(self, conversation_id: int, title: str) -> None:
        self.ctx.store.rename(conversation_id, title)
        if conversation_id == self.conversation_id:
            self.conversation_opened.emit(conversation_id, title)

    def delete_conversation(self, conversation_id: int) -> None:
        self.ctx.store.delete(conversation_id)
        if conversation_id == self.conversation_id:
            self.new_conversation()
        self.refresh_conversations()

    def n_ctx(self) -> int:
        s = self.ctx.session
        return s.n_ctx_seq if s is not None else 0

    # chat -----------------------------------------------------------------------------------
    def busy(self) -> bool:
        return self._worker is not None

    def send(self, text: str) -> None:
        text = text.strip()
        if not text or self.busy():
            return
        session = self._loaded_session()
        if session is None:
            return
        if not self.conversation_id:
            title = " ".join(text.split()[:8])[:60] or "New chat"
            self.conversation_id = self.ctx.store.create(title, self.ctx.settings.system_prompt)
            self.conversation_opened.emit(self.conversation_id, title)
        message = Message("user", text)
        self.ctx.store.add_message(self.conversation_id, message)  # committed before anything else
        self.chat_model.append(message)
        self.refresh_conversations()
        self._start_reply(session)

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()

    def regenerate(self) -> None:
        rows = self.chat_model.rowCount()
        if self.busy() or rows == 0 or self.chat_model.message(rows - 1).role != "assistant":
            return
        session = self._loaded_session()
        if session is None:  # checked before truncating, so nothing is lost
            return
        self._truncate(rows - 1)
        self._start_reply(session)

    def edit(self, row: int, text: str) -> None:
        """Replace user message `row` with `text`, dropping everything after it, and resend."""
        if self.busy() or self.chat_model.message(row).role != "user":
            return
        if self._loaded_session() is None:  # checked before truncating, so nothing is lost
            return
        self._truncate(row)
        self.send(text)

    def _loaded_session(self) -> SessionApi | None:
        """The loaded LLM, or None after telling the user to load one."""
        if self.ctx.session is None:
            self.failed.emit("Load a model first (Ctrl+O or the Models tab).")
        return self.ctx.session

    def _truncate(self, row: int) -> None:
        self.ctx.store.delete_from(self.conversation_id, self.chat_model.message(row).id)
        self.chat_model.truncate(row)

    def _history(self) -> list[dict]:
        system = self.ctx.settings.system_prompt.strip()
        head = [{"role": "system", "content": system}] if system else []
        return head + [{"role": m.role, "content": m.content} for m in self.chat_model.messages()]

    def _start_reply(self, session: SessionApi) -> None:
        history = self._history()
        reply = Message("assistant", "")
        self._reply_id = self.ctx.store.add_message(self.conversation_id, reply)
        self._saved_at = time.monotonic()
        self.chat_model.append(reply, streaming=True)
        worker = GenerationWorker(session, history, self.ctx.settings.sampling)
        worker.token_received.connect(self._on_token)
        worker.step_received.connect(self._on_step)
        worker.replied.connect(self._on_replied)
        worker.failed.connect(self._on_failed)
        worker.finished.connect(self._on_finished)
        self._worker = self.ctx.pool.start(worker)
        self.busy_changed.emit(True)

    def _on_token(self, text: str) -> None:
        self.chat_model.append_delta(text)
        if time.monotonic() - self._saved_at > SAVE_INTERVAL_S:
            self._saved_at = time.monotonic()
            self.ctx.store.update_message(self._reply_id, self.chat_model.streaming_message().content)

    def _on_step(self, step: ReplyStep) -> None:
        self.step_received.emit(step)
        self.context_changed.emit(step.n_prompt + step.n_generated, self.n_ctx())

    def _on_replied(self, stats: dict) -> None:
        message = self.chat_model.streaming_message()
        if message is not None:
            self.ctx.store.update_message(self._reply_id, message.content, stats)
        self.chat_model.finish_streaming(stats)

    def _on_failed(self, error: str) -> None:
        message = self.chat_model.streaming_message()
        if message is not None:
            self.ctx.store.update_message(self._reply_id, message.content)
        self.chat_model.finish_streaming(error=error)
        self.failed.emit(error)

    def _on_finished(self) -> None:
        self._worker = None
        self.refresh_conversations()
        self.busy_changed.emit(False)
