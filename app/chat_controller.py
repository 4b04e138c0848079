"""ChatController: send / stop / regenerate / edit, persisting every message as it is sent.

Every store call is guarded: a full disk, a read-only folder or a locked file becomes a message
(storage_failed) and never an exception in a Qt slot; what the user sees stays on screen, and a
message that could not be saved says so on its bubble.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from .context import AppContext
from .data_folder import STORE_ERRORS, describe_storage_error
from .engine_api import ChatLlmApi
from .item_models.chat_list_model import ChatListModel
from .item_models.conversation_list_model import ConversationListModel
from .storage import Message
from .stream_buffer import FramePacer, StepBuffer, merge_steps
from .vision_files import ImageAttachment, with_markers
from .workers import GenerationWorker

SAVE_INTERVAL_S = 1.0  # a streaming reply is rewritten in the store at most this often
# the context gauge and the status bar follow a streaming reply this often (and at its end): a
# new count in the status bar relayouts it, which cost as much as the reply's own frame
CONTEXT_INTERVAL_S = 0.25

log = logging.getLogger(__name__)


class ChatController(QObject):
    busy_changed = Signal(bool)
    step_received = Signal(object)  # ReplyStep, for the dashboard's tokens/s
    context_changed = Signal(int, int)  # tokens used, tokens available to the chat
    failed = Signal(str)
    conversation_opened = Signal(int, str)  # id, title
    storage_failed = Signal(str)  # a history read or write failed: what, and why, in words
    # row, text, images: the edit was not applied; give them back
    edit_refused = Signal(int, str, list)
    conversation_llm = Signal(
        str, str
    )  # endpoint URL ('' for a local file), model: who answered last

    def __init__(self, ctx: AppContext, parent=None):
        super().__init__(parent)
        self.ctx = ctx
        self.chat_model = ChatListModel(self)
        self.conversations = ConversationListModel(self)
        self.conversations.title_edited.connect(self._on_title_edited)
        self.conversation_id = 0
        self._worker: GenerationWorker | None = None
        self._reply: Message | None = None  # the streaming reply; _reply_id 0: not in the store
        self._reply_id, self._saved_at, self._context_at = 0, 0.0, 0.0
        self._buffer = StepBuffer()  # the streaming reply's steps, drained once per frame
        self._pacer = FramePacer()
        self._shown_frames = 0  # frames that showed some of the streaming reply
        self._frame = QTimer(self)
        self._frame.setSingleShot(True)
        self._frame.timeout.connect(self._on_frame)
        self._search = ""
        self.refresh_conversations()

    # conversations ----------------------------------------------------------------------------
    def refresh_conversations(self, search: str | None = None) -> None:
        self._search = self._search if search is None else search
        try:
            rows = self.ctx.store.list(self._search)
        except STORE_ERRORS as e:  # the list on screen stays as it was
            self._storage_error("The conversation list could not be read", e)
            return
        self.conversations.set_conversations(rows)

    def new_conversation(self) -> None:
        self.conversation_id = 0
        self.chat_model.set_messages([])
        self.conversation_opened.emit(0, "New chat")
        self.context_changed.emit(0, self.n_ctx())

    def open_conversation(self, conversation_id: int) -> None:
        if self.busy() or conversation_id == self.conversation_id:
            return
        try:
            messages, title = (
                self.ctx.store.messages(conversation_id),
                self.ctx.store.title(conversation_id),
            )
        except STORE_ERRORS as e:
            self._storage_error("The conversation could not be opened", e)
            return
        self.conversation_id = conversation_id
        self.chat_model.set_messages(messages)
        self.conversation_opened.emit(conversation_id, title)
        last = next((m.stats for m in reversed(messages) if m.stats), {})
        self.context_changed.emit(
            last.get("n_prompt", 0) + last.get("n_generated", 0), self.n_ctx()
        )
        replay = last.get("replay")
        if isinstance(replay, dict) and replay.get("model"):
            self.conversation_llm.emit(str(replay.get("endpoint") or ""), str(replay["model"]))

    def _on_title_edited(self, conversation_id: int, title: str) -> None:
        try:
            self.ctx.store.rename(conversation_id, title)
        except STORE_ERRORS as e:
            self._storage_error("The new title was not saved", e)
            # back to the stored title, after the view's editor has finished with the model
            QTimer.singleShot(0, self.refresh_conversations)
            return
        if conversation_id == self.conversation_id:
            self.conversation_opened.emit(conversation_id, title)

    def delete_conversation(self, conversation_id: int) -> None:
        try:
            self.ctx.store.delete(conversation_id)
        except STORE_ERRORS as e:
            self._storage_error("The conversation was not deleted", e)
            return
        if conversation_id == self.conversation_id:
            self.new_conversation()
        self.refresh_conversations()

    def import_conversation(self, path: str) -> None:
        """Add a conversation exported as JSON, and open it."""
        try:
            conversation_id = self.ctx.store.import_file(path)
        # ValueError: not JSON, or not an export (the store checks it); the other two as well, so
        # that no parse of a hostile file can raise out of this slot
        except (*STORE_ERRORS, ValueError, RecursionError, MemoryError) as e:
            self._storage_error(f"{Path(path).name} was not imported", e)
            return
        self.refresh_conversations()
        self.open_conversation(conversation_id)

    def n_ctx(self) -> int:
        llm = self.ctx.chat_llm
        return llm.n_ctx_seq if llm is not None else 0

    # chat -----------------------------------------------------------------------------------
    def busy(self) -> bool:
        return self._worker is not None

    def send(self, text: str, images: Sequence[ImageAttachment] = ()) -> None:
        text = text.strip()
        if (not text and not images) or self.busy():
            return
        session = self._loaded_session()
        if session is None:
            return
        if images and not session.projector:
            self.failed.emit(
                f"{session.name} cannot read images: no projector (mmproj) file was loaded with it."
            )
            return
        message = Message("user", text, images=list(images))
        self.chat_model.append(message)  # on screen first: a failed write must not lose it
        try:
            if not self.conversation_id:
                title = " ".join(text.split()[:8])[:60] or _image_title(images)
                self.conversation_id = self.ctx.store.create(title, self.ctx.settings.system_prompt)
                self.conversation_opened.emit(self.conversation_id, title)
            self.ctx.store.add_message(
                self.conversation_id, message
            )  # committed before the reply starts
        except STORE_ERRORS as e:
            self._not_saved(message, "Your message was not saved", e)
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
        if session is None or not self._truncate(rows - 1):  # checked first, so nothing is lost
            return
        self._start_reply(session)

    def edit(self, row: int, text: str, images: Sequence[ImageAttachment] = ()) -> None:
        """Replace user message `row` with `text` (and `images`), dropping everything after it,
        and resend."""
        if self.busy() or self.chat_model.message(row).role != "user":
            return
        if self._loaded_session() is None:  # checked before truncating, so nothing is lost
            return
        if not self._truncate(row):
            self.edit_refused.emit(row, text, list(images))  # the input box was cleared on submit
            return
        self.send(text, images)

    def _loaded_session(self) -> ChatLlmApi | None:
        """The LLM to chat with (loaded, or on a remote server), or None after telling the user
        to choose one."""
        llm = self.ctx.chat_llm
        if llm is None:
            self.failed.emit(
                "Load a model first (Ctrl+O or the Models tab), or choose one on a remote server."
            )
        return llm

    def _truncate(self, row: int) -> bool:
        """Drop `row` and everything after it; False, with nothing changed, if the store refused."""
        saved = [m.id for m in self.chat_model.messages()[row:] if m.id]  # id 0: never stored
        try:
            if saved and self.conversation_id:
                self.ctx.store.delete_from(self.conversation_id, saved[0])
        except STORE_ERRORS as e:
            self._storage_error("Nothing was changed, the history could not be updated", e)
            return False
        self.chat_model.truncate(row)
        return True

    def _storage_error(self, what: str, e: BaseException) -> None:
        log.warning("%s: %s", what, e)
        self.storage_failed.emit(f"{what}: {describe_storage_error(e)}.")

    def _not_saved(self, message: Message, what: str, e: BaseException) -> None:
        self.chat_model.set_error(message, f"Not saved: {describe_storage_error(e)}")
        self._storage_error(what, e)

    def _history(self, vision: bool) -> list[dict]:
        """The messages as the LLM sees them. A message's images go with it (engine_api.py's
        ChatLlmApi): one MEDIA_MARKER each in its content, their bytes under "images". An LLM
        without a projector gets the text only."""
        system = self.ctx.settings.system_prompt.strip()
        head = [{"role": "system", "content": system}] if system else []
        out = []
        for m in self.chat_model.messages():
            if vision and m.images:
                out.append(
                    {
                        "role": m.role,
                        "content": with_markers(m.content, len(m.images)),
                        "images": [i.data for i in m.images],
                    }
                )
            else:
                out.append({"role": m.role, "content": m.content})
        return head + out

    def _start_reply(self, session: ChatLlmApi) -> None:
        history = self._history(bool(session.projector))
        reply = self._reply = Message("assistant", "")
        self.chat_model.append(reply, streaming=True)
        self._reply_id, self._saved_at = 0, time.monotonic()
        try:
            if self.conversation_id:  # else the user's message was not saved and the bubble says so
                self._reply_id = self.ctx.store.add_message(self.conversation_id, reply)
        except STORE_ERRORS as e:
            self._not_saved(reply, "The reply will not be saved", e)
        self._buffer = StepBuffer()
        worker = GenerationWorker(session, history, self.ctx.settings.sampling, self._buffer)
        worker.replied.connect(self._on_replied)
        worker.failed.connect(self._on_failed)
        worker.finished.connect(self._on_finished)
        self._worker = self.ctx.pool.start(worker)
        self._shown_frames = 0
        self._frame.start(self._pacer.start())
        self.busy_changed.emit(True)

    def _on_frame(self) -> None:
        shown = self._show_steps()
        self._shown_frames += shown
        if self._worker is not None:
            # paced by the GUI's work since the last frame that showed something; up to the
            # first frame with text that is sending the message and opening the reply's
            # bubble, a one-off that would hold the second frame back for a quarter second:
            # the clock restarts
            steady = shown and self._shown_frames > 1
            self._frame.start(self._pacer.next_ms() if steady else self._pacer.start())

    def _show_steps(self, last: bool = False) -> bool:
        """Everything the worker streamed since the last frame, as one update of each view;
        False when nothing came."""
        text, step = merge_steps(self._buffer.drain())
        if step is None:
            return False
        self.chat_model.set_phase("" if text else step.phase)
        if step.phase:  # the engine is still encoding an image: no tokens to count yet
            return True
        now = time.monotonic()
        if text:
            self.chat_model.append_delta(text)
            if now - self._saved_at > SAVE_INTERVAL_S:
                self._saved_at = now
                self._save_reply()
        self.step_received.emit(step)  # after the text: a receiver sees the step's tokens shown
        if last or now - self._context_at >= CONTEXT_INTERVAL_S:
            self._context_at = now
            self.context_changed.emit(step.n_prompt + step.n_generated, self.n_ctx())
        return True

    def _on_replied(self, stats: dict) -> None:
        self._show_steps(last=True)  # the last steps, put before `replied` was emitted
        self._save_reply(stats)
        self.chat_model.finish_streaming(stats)

    def _on_failed(self, error: str) -> None:
        self._show_steps(last=True)
        self._save_reply()
        self.chat_model.finish_streaming(error=error)
        self.failed.emit(error)

    def _save_reply(self, stats: dict | None = None) -> None:
        reply = self.chat_model.streaming_message()
        if reply is None or reply is not self._reply or not self._reply_id:
            return
        try:
            self.ctx.store.update_message(self._reply_id, reply.content, stats)
        except STORE_ERRORS as e:
            self._reply_id = 0  # not retried on every token: the bubble says it is not saved
            self._not_saved(reply, "The reply was not saved", e)

    def _on_finished(self) -> None:
        self._frame.stop()
        self._worker = None
        self.refresh_conversations()
        self.busy_changed.emit(False)


def _image_title(images: Sequence[ImageAttachment]) -> str:
    return images[0].name[:60] if images else "New chat"
