"""The typed seams of the engine: what the scheduler needs of a context and a tokenizer, and
what the server needs of a loaded model.

The real classes (engine.context.Context, engine.tokenizer.base.Tokenizer, engine.model.Model)
and the test fakes (engine/server/testing.py) both implement these Protocols, so a fake that
drifts from the real thing is a type error (mypy) instead of a `getattr` default at run time.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from .batch import Batch


class MediaSpanLike(Protocol):
    """An image span of a prompt, as the scheduler decodes it (engine.vision.MediaSpan)."""

    @property
    def start(self) -> int: ...
    @property
    def n_tokens(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def id(self) -> str: ...
    @property
    def non_causal(self) -> bool: ...
    @property
    def encoded(self) -> bool: ...
    @property
    def t_encode_ms(self) -> float: ...
    def embed(self, cancel: threading.Event | None = None) -> np.ndarray: ...


class SequenceCache(Protocol):
    """The KV-cache operations on one sequence that the scheduler performs (llama_memory_seq_*)."""

    def seq_len(self, seq: int) -> int: ...
    def seq_clear(self, seq: int) -> None: ...
    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None: ...
    def seq_shift_discard(self, seq: int, p0: int, n: int) -> None: ...


class DecodeContext(Protocol):
    """A model plus its KV cache, as the scheduler drives it (llama_context)."""

    @property
    def kv(self) -> SequenceCache: ...
    @property
    def n_ctx_seq(self) -> int: ...  # positions one sequence may use
    @property
    def n_seq_max(self) -> int: ...
    @property
    def n_batch(self) -> int: ...  # most tokens one decode() accepts
    @property
    def n_vocab(self) -> int: ...

    def decode(self, batch: Batch, embeddings: bool = False) -> np.ndarray:
        """(n_outputs, n_vocab) logits, or (n_outputs, n_embd) hidden states."""
        ...


class GenerationTokenizer(Protocol):
    """What sampling and streaming detokenization need of a tokenizer."""

    @property
    def n_vocab(self) -> int: ...
    @property
    def add_bos(self) -> bool: ...
    @property
    def bos_id(self) -> int | None: ...
    @property
    def eog_ids(self) -> Collection[int]: ...

    def is_eog(self, token_id: int) -> bool: ...
    def token_to_piece(self, token_id: int, special: bool = True) -> bytes: ...


class ChatTokenizer(GenerationTokenizer, Protocol):
    """A tokenizer that also turns rendered chat text into prompt tokens."""

    @property
    def add_eos(self) -> bool: ...
    @property
    def eos_id(self) -> int | None: ...

    def encode(
        self, text: str, add_special: bool = True, parse_special: bool = False
    ) -> list[int]: ...


class ServerTokenizer(ChatTokenizer, Protocol):
    """A tokenizer as the HTTP routes use it (/tokenize, /detokenize, prompts)."""

    @property
    def eos_id(self) -> int | None: ...
    @property
    def vocab_type(self) -> int: ...  # llama.cpp's enum: 1 SPM, 2 BPE
    @property
    def max_token_bytes(self) -> int: ...  # the most text bytes one token stands for

    def decode(self, ids: Sequence[int]) -> str: ...


class PromptTemplate(Protocol):
    """A chat template (engine.tokenizer.chat_template.ChatTemplate)."""

    @property
    def source(self) -> str: ...
    @property
    def stop_strings(self) -> tuple[str, ...]: ...

    def render(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list | None = None,
        **extra: Any,
    ) -> str: ...


class ModelFacts(Protocol):
    """The hyper-parameters a loaded model reports (/props, /v1/models, the dashboard)."""

    @property
    def arch(self) -> str: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def n_ctx_train(self) -> int: ...
    @property
    def n_embd(self) -> int: ...


class MetadataSource(Protocol):
    """GGUF metadata lookups (chat template, pooling type)."""

    def get(self, key: str, default: Any = None) -> Any: ...


class ServedModel(Protocol):
    """A loaded model as the server and the app see it (engine.model.Model)."""

    @property
    def path(self) -> str: ...
    @property
    def cfg(self) -> ModelFacts: ...
    @property
    def tokenizer(self) -> ServerTokenizer: ...
    @property
    def gguf(self) -> MetadataSource: ...
    @property
    def n_params(self) -> int: ...
