"""What callers hand the scheduler (requests) and what they hold while it runs (handles).

A `RequestHandle` is the consumer's end of one request: the scheduler's thread puts
`GenerationStep`s (or one `EmbeddingResult`) into its queue, then `END`; an exception in the
queue is re-raised on the consumer side. Iterate it from a thread, `astream()` it from an
event loop, or let the scheduler step inline and read what is ready with `drain()`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np

from .sampling import SamplingParams
from .sequence import GenerationStep

if TYPE_CHECKING:
    import asyncio

    from .grammar import Grammar


@dataclass
class GenerationRequest:
    """One completion: an already-tokenized prompt, how to sample and when to stop.

    Args:
        prompt: token ids (BOS/template already applied by the caller).
        params: sampling parameters.
        n_predict: most tokens to generate; -1 = until EOG or the slot's context is full.
        stop: stop strings (held back from the stream and not included in the text).
        cache_prompt: reuse the slot's KV for the longest common prefix.
        id_slot: pin to a slot (-1 = the slot with the longest cached prefix).
        n_keep: prompt tokens a context shift keeps (BOS is added when the model uses one;
            -1 = the whole prompt; None = the scheduler's --keep).
        grammar: constrain the output (GBNF, JSON schema...; engine/grammar.py).
        return_progress: also put `PromptProgress` items in the handle: one when the request
            takes its slot, one after each decoded prompt chunk (llama-server's
            return_progress); the consumer must expect them among the steps.
    """

    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1
    stop: Sequence[str] = ()
    cache_prompt: bool = True
    id_slot: int = -1
    n_keep: int | None = None
    grammar: Grammar | None = None
    return_progress: bool = False


@dataclass(frozen=True)
class PromptProgress:
    """How far a request's prompt is evaluated: `processed` of `total` tokens, the first
    `cache` of them reused from the slot's cache."""

    total: int
    cache: int
    processed: int


@dataclass
class EmbeddingRequest:
    """Pooled (or per-token, pooling 'none') final hidden states of a prompt."""

    prompt: list[int]
    pooling: str = "mean"
    normalize: int = 2  # llama.cpp --embd-normalize: -1 none, 0 max-abs int16, 1 L1, 2 L2, >2 p-norm
    id_slot: int = -1


@dataclass(frozen=True)
class EmbeddingResult:
    embedding: np.ndarray  # (n_embd,) pooled, or (n_tokens, n_embd) for pooling 'none'
    n_prompt: int


Request = GenerationRequest | EmbeddingRequest
ItemT = TypeVar("ItemT", GenerationStep, EmbeddingResult)


class _End:
    """End of a request's stream (a singleton marker in its queue)."""


END = _End()


class RequestHandle(Generic[ItemT]):
    """The consumer's side of one submitted request: GenerationSteps for a
    GenerationRequest, one EmbeddingResult for an EmbeddingRequest.

    `cancel()` frees the slot at the scheduler's next step; the stream then ends.
    """

    def __init__(self, request_id: int, request: Request, wake: Callable[[], None]):
        self.id = request_id
        self.request = request
        self.slot_id = -1
        self.done = False
        self._wake = wake
        self._queue: queue.SimpleQueue[ItemT | BaseException | _End] = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    # -- producer side (the scheduler's thread) --
    def put(self, item: ItemT | BaseException | _End) -> None:
        self._queue.put(item)
        loop, event = self._loop, self._event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # loop closed: the consumer is gone
                pass

    def finish(self, error: BaseException | None = None) -> None:
        """End the stream, with an error for the consumer if given."""
        if error is not None:
            self.put(error)
        self.put(END)

    # -- consumer side --
    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop this request; its slot is freed at the next scheduler step."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._wake()

    def _unpack(self, item: ItemT | BaseException | _End) -> ItemT | None:
        if isinstance(item, _End):
            self.done = True
            return None
        if isinstance(item, BaseException):
            self.done = True
            raise item
        return item

    def __iter__(self) -> Iterator[ItemT]:
        while not self.done:
            item = self._unpack(self._queue.get())
            if item is not None:
                yield item

    def drain(self) -> Iterator[ItemT]:
        """What is ready now, without blocking (for a scheduler stepped inline)."""
        while not self.done:
            try:
                raw = self._queue.get_nowait()
            except queue.Empty:
                return
            item = self._unpack(raw)
            if item is not None:
                yield item

    async def astream(self) -> AsyncIterator[ItemT]:
        """Async iterator over the items; never blocks the event loop."""
        import asyncio  # here: `ggstation generate` and chat never load asyncio

        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        while not self.done:
            self._event.clear()
            try:
                raw = self._queue.get_nowait()
            except queue.Empty:
                await self._event.wait()
                continue
            item = self._unpack(raw)
            if item is not None:
                yield item

    def result(self) -> list[ItemT]:
        """Block until the request ends; all its steps (or the single EmbeddingResult)."""
        return list(self)
