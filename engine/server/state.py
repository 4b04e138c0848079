"""ServerOptions (what the flags chose) and ServerState (what the HTTP routes read).

The state starts LOADING, so the server can listen before the model is loaded; `ready()`
attaches the scheduler (which carries the model and its context) and `failed()` records a
load error. The desktop app builds a ready state around its own scheduler, so the server
shares the GUI's model instead of loading a second copy.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import EngineError, TemplateError
from ..sampling import SamplingParams

if TYPE_CHECKING:
    from ..scheduler import Scheduler
    from ..seams import PromptTemplate, ServedModel, ServerTokenizer
    from ..vision import Projector

DEFAULT_BODY_LIMIT = 8 * 1024 * 1024


class ServerStatus(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


class Sleeper(Protocol):
    """The sleep controller (engine/server/sleep.py, which imports this module) as the state and
    its owner see it: whether the model sleeps now, and who hears of each change."""

    is_sleeping: bool
    on_change: Callable[[bool], None] | None  # a router's child announces the new state


@dataclass
class ServerOptions:
    """HTTP-side choices; defaults are llama-server's."""

    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[
        str, ...
    ] = ()  # empty: CORS off; ("*",) any; ("localhost",) local pages only
    cors_methods: str = "GET, POST, DELETE, OPTIONS"  # llama-server's defaults, sent on preflights
    cors_headers: str = "*"
    cors_credentials: bool = True  # with "*": the request's Origin is echoed
    cors_proxy: bool = False  # /cors-proxy (--ui-mcp-proxy): forwards requests for the web UI's MCP
    model_tags: tuple[str, ...] = ()  # --tags, shown in /v1/models
    alias: str | None = None
    metrics: bool = False
    slots: bool = True
    props_writable: bool = False
    embeddings: bool = False
    pooling: str | None = None  # None: the model's, else mean
    embd_normalize: int = 2
    cache_prompt: bool = True
    n_predict: int = -1  # server-wide cap (-n)
    max_body_bytes: int = DEFAULT_BODY_LIMIT
    default_sampling: SamplingParams = field(default_factory=SamplingParams)  # from the flags
    chat_template_kwargs: dict = field(default_factory=dict)
    request_log: Callable[[dict], None] | None = None  # called after each request (GUI log)
    api_prefix: str = ""
    verbose: bool = False  # --verbose: every generation reply carries `__verbose` (llama-server)
    prefill_assistant: bool = True  # a chat ending with an assistant message continues it
    slot_save_path: str | None = None  # --slot-save-path: POST /slots/{id}?action=save|restore
    sleep_idle_seconds: float = -1  # --sleep-idle-seconds: unload the model when idle (-1: never)
    media_path: str | None = None  # --media-path: the folder file:// image URLs may read from


class ServerState:
    """Everything a route handler needs, shared by all requests.

    Routes that use the model only run once the state is READY (the HTTP middleware answers
    503 before that), so `scheduler`, `model` and `tokenizer` are only read then.
    """

    def __init__(self, options: ServerOptions | None = None):
        self.options = options or ServerOptions()
        self.status = ServerStatus.LOADING
        self.error: str | None = None
        self._scheduler: Scheduler | None = None
        self.chat_template: PromptTemplate | None = None
        self.projector: Projector | None = None  # the mmproj (-mm): images in prompts
        self.t_start = time.time()
        self.created = int(self.t_start)
        self._ready = threading.Event()
        self.sleep: Sleeper | None = None  # set by sleep.install (--sleep-idle-seconds)

    # -- lifecycle -----------------------------------------------------------------
    def set_ready(
        self,
        scheduler: Scheduler,
        chat_template: PromptTemplate | None = None,
        projector: Projector | None = None,
    ) -> None:
        """Attach a running scheduler whose `model` is set; the tokenizer comes from it.
        `projector`: the multimodal projector loaded with the model, if any."""
        if scheduler.model is None:
            raise EngineError("the server needs a scheduler that carries its model")
        self._scheduler = scheduler
        self.projector = projector
        self.chat_template = chat_template if chat_template is not None else self._model_template()
        self.status = ServerStatus.READY
        self._ready.set()

    def set_failed(self, message: str) -> None:
        self.error = message
        self.status = ServerStatus.FAILED
        self._ready.set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout) and self.status is ServerStatus.READY

    @property
    def is_ready(self) -> bool:
        return self.status is ServerStatus.READY

    @property
    def is_sleeping(self) -> bool:
        return self.sleep is not None and self.sleep.is_sleeping

    @property
    def scheduler(self) -> Scheduler:
        if self._scheduler is None:
            raise EngineError("the model is not loaded yet")
        return self._scheduler

    @property
    def model(self) -> ServedModel:
        model = self.scheduler.model
        assert model is not None  # checked by set_ready
        return model

    @property
    def tokenizer(self) -> ServerTokenizer:
        return self.model.tokenizer

    def _model_template(self) -> PromptTemplate | None:
        """The GGUF's own template (or the built-in for its family); None when unusable."""
        from ..tokenizer.chat_template import ChatTemplate

        try:
            return ChatTemplate.from_gguf(self.model.gguf)
        except TemplateError:
            return None

    # -- model facts for /props and /v1/models ----------------------------------------
    @property
    def model_path(self) -> str:
        return str(self.model.path) if self._scheduler is not None else ""

    @property
    def model_aliases(self) -> list[str]:
        """--alias names, sorted and without duplicates (llama-server keeps them in a set)."""
        return sorted({a.strip() for a in (self.options.alias or "").split(",") if a.strip()})

    @property
    def model_alias(self) -> str:
        """The model's name in the API: the first alias in sorted order, as llama-server's."""
        aliases = self.model_aliases
        return aliases[0] if aliases else Path(self.model_path).name or "model"

    @property
    def n_ctx_seq(self) -> int:
        return self._scheduler.n_ctx_seq if self._scheduler is not None else 0

    @property
    def n_slots(self) -> int:
        return self._scheduler.n_slots if self._scheduler is not None else 0

    @property
    def n_vocab(self) -> int:
        return self.model.cfg.n_vocab

    def model_meta(self) -> dict:
        cfg = self.model.cfg
        return {
            "vocab_type": self.tokenizer.vocab_type,
            "n_vocab": cfg.n_vocab,
            "n_ctx_train": cfg.n_ctx_train,
            "n_embd": cfg.n_embd,
            "n_params": self.model.n_params,
            "size": _file_size(self.model_path),
        }

    def pooling(self) -> str:
        """--pooling, else the model's `{arch}.pooling_type`, else mean (llama.cpp's names)."""
        if self.options.pooling:
            return self.options.pooling
        code = self.model.gguf.get(f"{self.model.cfg.arch}.pooling_type", -1)
        return {0: "none", 1: "mean", 2: "cls", 3: "last"}.get(
            code if isinstance(code, int) else -1, "mean"
        )


def _file_size(path: str) -> int | None:
    try:
        return Path(path).stat().st_size if path else None
    except OSError:
        return None
