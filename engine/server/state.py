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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

DEFAULT_BODY_LIMIT = 8 * 1024 * 1024


class ServerStatus(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


@dataclass
class ServerOptions:
    """HTTP-side choices; defaults are llama-server's."""

    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()  # empty: CORS off
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
    default_sampling: Any = None  # engine.sampling.SamplingParams from the flags
    chat_template_kwargs: dict = field(default_factory=dict)
    request_log: Callable[[dict], None] | None = None  # called after each request (GUI log)
    api_prefix: str = ""


class ServerState:
    """Everything a route handler needs, shared by all requests."""

    def __init__(self, options: ServerOptions | None = None):
        self.options = options or ServerOptions()
        self.status = ServerStatus.LOADING
        self.error: str | None = None
        self.scheduler = None
        self.model = None
        self.tokenizer = None
        self.chat_template = None
        self.t_start = time.time()
        self.created = int(self.t_start)
        self._ready = threading.Event()

    # -- lifecycle -----------------------------------------------------------------
    def set_ready(self, scheduler, chat_template=None) -> None:
        """Attach a running scheduler; the model and tokenizer come from it."""
        self.scheduler = scheduler
        self.model = scheduler.model
        self.tokenizer = scheduler.tokenizer
        self.chat_template = chat_template if chat_template is not None else self._load_template(None)
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

    def _load_template(self, override: str | None):
        from ..errors import TemplateError

        try:
            from ..tokenizer.chat_template import ChatTemplate

            return ChatTemplate.from_gguf(getattr(self.model, "gguf", None), override=override)
        except (TemplateError, ImportError, AttributeError, TypeError, ValueError):
            return None

    # -- model facts for /props and /v1/models ----------------------------------------
    @property
    def model_path(self) -> str:
        return str(getattr(self.model, "path", "") or "")

    @property
    def model_alias(self) -> str:
        if self.options.alias:
            return self.options.alias.split(",")[0].strip()
        return Path(self.model_path).name or "model"

    @property
    def n_ctx_seq(self) -> int:
        return self.scheduler.n_ctx_seq if self.scheduler else 0

    @property
    def n_slots(self) -> int:
        return self.scheduler.n_slots if self.scheduler else 0

    def model_meta(self) -> dict:
        cfg = getattr(self.model, "cfg", None)
        meta = {
            "vocab_type": getattr(self.tokenizer, "vocab_type", None) or getattr(self.tokenizer, "model_type", None),
            "n_vocab": getattr(cfg, "n_vocab", None),
            "n_ctx_train": getattr(cfg, "n_ctx_train", None),
            "n_embd": getattr(cfg, "n_embd", None),
            "n_params": getattr(self.model, "n_params", None),
            "size": _file_size(self.model_path),
        }
        return meta

    def pooling(self) -> str:
        if self.options.pooling:
            return self.options.pooling
        gguf = getattr(self.model, "gguf", None)
        arch = getattr(getattr(self.model, "cfg", None), "arch", "")
        try:
            code = gguf.get_int(f"{arch}.pooling_type", -1) if gguf is not None else -1
        except Exception:
            code = -1
        return {0: "none", 1: "mean", 2: "cls", 3: "last"}.get(code, "mean")


def _file_size(path: str) -> int | None:
    try:
        return Path(path).stat().st_size if path else None
    except OSError:
        return None
