"""What callers hand the scheduler (requests) and what they hold while it runs (handles).

A `RequestHandle` is the consumer's end of one request: the scheduler's thread puts
`GenerationStep`s (or one `EmbeddingResult`) into its queue, then `END`; an exception in the
queue is re-raised on the consumer side. Iterate it from a thread, `astream()` or
`abatches()` it from an event loop, or let the scheduler step inline and read what is ready
with `drain()`. Tokens may be put without waking the consumer (see RequestHandle).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np

from .sampling import SamplingParams
from .seams import MediaSpanLike
from .sequence import GenerationStep

if TYPE_CHECKING:
    import asyncio

    from .grammar import Grammar


# the scheduler wakes a streaming consumer at most about this often while tokens come faster
# (a display frame: a person sees no difference, a 250 tokens/s decode keeps ~4 % it spent on
# waking an HTTP loop per token); a blocked consumer looks for held items this often anyway
WAKE_INTERVAL_S = 0.016
POLL_S = 0.05


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
        wake_interval_s: while tokens come faster, wake the consumer about this often (a
            consumer that shows them at a lower rate, like the desktop app's chat, asks for
            its own frame interval; RequestHandle).
        media: the prompt's image spans (engine.vision.MediaPrompt.media): their positions
            in `prompt` hold negative placeholder ids, and each is decoded from its
            embeddings, in one batch of its own.
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
    wake_interval_s: float = WAKE_INTERVAL_S
    media: Sequence[MediaSpanLike] = ()


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
    normalize: int = (
        2  # llama.cpp --embd-normalize: -1 none, 0 max-abs int16, 1 L1, 2 L2, >2 p-norm
    )
    id_slot: int = -1
    media: Sequence[MediaSpanLike] = ()  # image spans, as GenerationRequest.media


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

    The producer may put an item without waking the consumer (`put(item, wake=False)`) and
    wake it later (`wake()`): the scheduler wakes a streaming consumer at most about once per
    `wake_interval_s` (the request's; WAKE_INTERVAL_S by default) while tokens come faster
    than that, so that a consumer on another thread (an HTTP event loop, the GUI's worker)
    takes several tokens per wake-up instead of costing the decode a thread switch, a loop
    iteration and a socket write per token. A consumer that is awake sees every item put so
    far, held or not; a blocked sync consumer looks again every POLL_S even without a wake.
    """

    def __init__(self, request_id: int, request: Request, wake: Callable[[], None]):
        self.id = request_id
        self.request = request
        self.slot_id = -1
        self.done = False
        self._wake_scheduler = wake
        self._items: collections.deque[ItemT | BaseException | _End] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self.held = False  # items put since the consumer was last woken
        self.wake_interval_s = (
            request.wake_interval_s if isinstance(request, GenerationRequest) else WAKE_INTERVAL_S
        )
        self.t_woken = 0.0  # perf_counter of the last wake-up (0: never)
        self._cancelled = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    # -- producer side (the scheduler's thread) --
    def put(self, item: ItemT | BaseException | _End, wake: bool = True) -> None:
        with self._cond:
            self._items.append(item)
            if not wake:
                self.held = True
                return
        self.wake()

    def wake(self) -> None:
        """Wake the consumer for what it has not seen yet."""
        with self._cond:
            self.held = False
            self.t_woken = time.perf_counter()
            self._cond.notify_all()
        loop, event = self._loop, self._event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # loop closed: the consumer is gone
                pass

    def finish(self, error: BaseException | None = None) -> None:
        """End the stream, with an error for the consumer if given."""
        if error is not None:
            self.put(error, wake=False)
        self.put(END)

    # -- consumer side --
    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop this request; its slot is freed at the next scheduler step."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._wake_scheduler()

    def _take(self, timeout: float | None = 0.0) -> list[ItemT | BaseException | _End]:
        """Every item put so far; waits up to `timeout` (None: POLL_S at a time, until one
        comes) while there is none."""
        with self._cond:
            while not self._items and timeout != 0.0:
                self._cond.wait(POLL_S if timeout is None else timeout)
                if timeout is not None:
                    break
            items = list(self._items)
            self._items.clear()
        return items

    def _unpack(self, item: ItemT | BaseException | _End) -> ItemT | None:
        if isinstance(item, _End):
            self.done = True
            return None
        if isinstance(item, BaseException):
            self.done = True
            raise item
        return item

    def _each(self, raw: list[ItemT | BaseException | _End]) -> Generator[ItemT, None, None]:
        """The items of `raw` in order (an error raised where it stands); what a consumer that
        stops early leaves goes back to the front of the queue."""
        i = 0
        try:
            while i < len(raw) and not self.done:
                i += 1
                item = self._unpack(raw[i - 1])
                if item is not None:
                    yield item
        finally:
            self._requeue(raw[i:])

    def _requeue(self, rest: list) -> None:
        if rest:
            with self._cond:
                self._items.extendleft(reversed(rest))

    def __iter__(self) -> Iterator[ItemT]:
        while not self.done:
            yield from self._each(self._take(None))

    def drain(self) -> Iterator[ItemT]:
        """What is ready now, without blocking (for a scheduler stepped inline)."""
        if not self.done:
            yield from self._each(self._take())

    def _attach(self) -> asyncio.Event:
        import asyncio  # here: `ggstation generate` and chat never load asyncio

        self._loop = asyncio.get_running_loop()
        self._event = event = asyncio.Event()
        return event

    async def _ready(self) -> AsyncIterator[list[ItemT | BaseException | _End]]:
        """What has been put, each time there is some, until the stream ends."""
        event = self._attach()
        while not self.done:
            event.clear()
            raw = self._take()
            if raw:
                yield raw
            else:
                await event.wait()

    async def abatches(self) -> AsyncIterator[list[ItemT]]:
        """Async iterator over the items, as lists of those that came by each wake-up (to be
        written out together); never blocks the event loop. An error is raised after the
        list of the items put before it."""
        async for raw in self._ready():
            n = next(
                (i for i, r in enumerate(raw) if isinstance(r, BaseException)), len(raw)
            ) or len(raw)
            self._requeue(raw[n:])
            batch = list(self._each(raw[:n]))
            if batch:
                yield batch

    async def astream(self) -> AsyncIterator[ItemT]:
        """Async iterator over the items; never blocks the event loop."""
        async for raw in self._ready():
            items = self._each(raw)
            try:
                for item in items:
                    yield item
            finally:
                items.close()

    def result(self) -> list[ItemT]:
        """Block until the request ends; all its steps (or the single EmbeddingResult)."""
        return list(self)
