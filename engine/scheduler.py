"""Scheduler: the one decode driver. It owns a context; every front end talks to it.

The loop mirrors llama.cpp's `update_slots()`: each step builds ONE batch from every active
slot (a prompt chunk for slots still reading their prompt, one token for each generating
slot), runs a single `ctx.decode`, and hands each slot's row of logits to its
`SequenceGenerator`, whose `GenerationStep` goes to the request's handle.

    Slot states:   IDLE --admit--> PROMPT --prompt done--> GENERATING --finish/cancel--> IDLE
                   IDLE --admit embedding--> EMBEDDING --pooled--> IDLE

Prompt-prefix reuse, context shift and timings exist here and nowhere else. Two ways to
drive it, both on the thread that owns the model, which is the thread that launches the
kernels:
- `start()` / `run()`: a loop that blocks on the request queue (server, desktop app);
  HTTP handlers and GUI workers submit requests and consume their handles.
- `stream(request)`: step inline on the caller's thread until the request ends (the CLI's
  `generate` and `chat`, like llama-cli reusing llama-server's slots).
"""

from __future__ import annotations

import collections
import enum
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from .batch import Batch
from .embedding import POOLING_TYPES, pool_embeddings
from .errors import (
    ContextOverflowError,
    EngineError,
    InvalidRequestError,
    KVCacheFullError,
    SchedulerStoppedError,
)
from .seams import DecodeContext, GenerationTokenizer, MediaSpanLike, ServedModel
from .sequence import GenerationStep, SequenceGenerator
from .tasks import (
    EmbeddingRequest,
    EmbeddingResult,
    GenerationRequest,
    PromptProgress,
    Request,
    RequestHandle,
)

log = logging.getLogger(__name__)

MIN_CTX_FOR_SHIFT = 8  # below this a context shift cannot free room (llama.cpp keeps n_ctx - 4)


class SlotState(enum.Enum):
    IDLE = "idle"
    PROMPT = "prompt"
    GENERATING = "generating"
    EMBEDDING = "embedding"


@dataclass
class SchedulerMetrics:
    """Counters in the units of llama-server's /metrics."""

    n_prompt_tokens_total: int = 0  # decoded prompt tokens; a reused cache prefix is not
    n_prompt_tokens_cached_total: int = 0  # prompt tokens reused from a slot's cache
    n_tokens_max: int = 0  # longest sequence seen in a slot (prompt + generation)
    t_prompt_s_total: float = 0.0
    n_tokens_predicted_total: int = 0
    t_predicted_s_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_requests_total: int = 0
    n_requests_failed: int = 0


@dataclass
class _Slot:
    id: int
    state: SlotState = SlotState.IDLE
    handle: RequestHandle[Any] | None = None
    cache_tokens: list[int] = field(default_factory=list)  # token ids whose KV sits in seq `id`
    prompt: list[int] = field(default_factory=list)
    i_prompt: int = 0  # next prompt index to feed
    n_keep: int = 0  # the request's --keep (-1: whole prompt), for a context shift
    generator: SequenceGenerator | None = None
    next_token: int = -1  # sampled, not yet fed
    n_generated: int = 0
    embd_rows: list[np.ndarray] = field(default_factory=list)
    media: dict[int, MediaSpanLike] = field(default_factory=dict)  # the prompt's, by start
    # the image spans whose KV sits in the sequence: start -> (span id, n_tokens)
    cache_media: dict[int, tuple[str, int]] = field(default_factory=dict)
    last_request: Any = None  # the request it runs or ran last, its id and reused prefix (/slots)
    last_task_id: int = -1
    n_prompt_cached: int = 0
    t_last_used: float = 0.0

    @property
    def busy(self) -> bool:
        return self.state is not SlotState.IDLE


@dataclass(frozen=True)
class _Entry:
    """One slot's share of a batch: tokens fed at positions pos0.. of its sequence."""

    slot: _Slot
    tokens: list[int]
    pos0: int
    wants_logits: bool
    span: MediaSpanLike | None = None  # an image span: its tokens are placeholders


def media_prefix(
    n: int, cached: dict[int, tuple[str, int]], media: dict[int, MediaSpanLike]
) -> int:
    """The longest reusable prefix of at most n tokens when image spans are involved: it
    never ends inside an image, and covers an image only when the cached one has the same
    id (equal placeholders are not proof: they are a hash's residue)."""
    for start in sorted(media):
        span = media[start]
        if start >= n:
            break
        if start + span.n_tokens > n or cached.get(start) != (span.id, span.n_tokens):
            return start
    return n


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Scheduler:
    """Owns a context; serves GenerationRequests and EmbeddingRequests.

    Args:
        ctx: the context (engine.context.Context, or a fake with the same seam).
        tokenizer: the model's tokenizer (sampling, detokenization, BOS for n_keep).
        n_slots: parallel sequences (default: the context's n_seq_max).
        model: the loaded model, kept for callers (server /props, GUI).
        slot_prompt_similarity: a free slot whose cached prefix covers at least this share
            of the prompt is preferred (llama.cpp -sps); otherwise the least recently used.
        context_shift: when a generating slot fills its context, drop half of the tokens
            after the first n_keep and go on (llama.cpp --context-shift); otherwise the
            generation ends with finish reason "length" when the context is full.
        n_keep: default tokens kept at the start on a context shift (-1: the whole prompt).
    """

    def __init__(
        self,
        ctx: DecodeContext,
        tokenizer: GenerationTokenizer,
        *,
        n_slots: int | None = None,
        model: ServedModel | None = None,
        slot_prompt_similarity: float = 0.1,
        context_shift: bool = False,
        n_keep: int = 0,
    ):
        self.ctx = ctx
        self.tokenizer = tokenizer
        self.model = model
        self.n_slots = int(n_slots or ctx.n_seq_max)
        if not 1 <= self.n_slots <= ctx.n_seq_max:
            raise EngineError(
                f"{self.n_slots} slots need a context with as many sequences "
                f"(it has {ctx.n_seq_max})"
            )
        self.n_batch = int(ctx.n_batch)
        self._budget = self.n_batch  # tokens per step; halved while a unified KV pool is full
        self.n_ctx_seq = int(ctx.n_ctx_seq)
        self.slot_prompt_similarity = slot_prompt_similarity
        self.context_shift = context_shift and self.n_ctx_seq >= MIN_CTX_FOR_SHIFT
        self.n_keep = n_keep
        self.slots = [_Slot(i) for i in range(self.n_slots)]
        self.metrics = SchedulerMetrics()
        self._pending: collections.deque[RequestHandle[Any]] = collections.deque()
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._calls: collections.deque[tuple[Callable[[], Any], int, Future]] = collections.deque()
        self._looping = False
        self._dt_step = 0.0  # the last generation step's time: how long a held token may wait more

    # ------------------------------------------------------------------ public API
    @overload
    def submit(self, request: GenerationRequest) -> RequestHandle[GenerationStep]: ...
    @overload
    def submit(self, request: EmbeddingRequest) -> RequestHandle[EmbeddingResult]: ...

    def submit(self, request: Request) -> RequestHandle[Any]:
        """Queue a request; returns its handle at once.

        Raises:
            ContextOverflowError: the prompt does not fit in one slot's context.
            InvalidRequestError: empty prompt, token out of range, bad slot id or pooling.
            SchedulerStoppedError: the scheduler is shutting down.
        """
        self._validate(request)
        handle: RequestHandle[Any] = RequestHandle(next(self._ids), request, self._wakeup.set)
        with self._lock:
            if self._stopping.is_set():
                raise SchedulerStoppedError("server is shutting down")
            self._pending.append(handle)
            self.metrics.n_requests_total += 1
        self._wakeup.set()
        return handle

    def stream(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationStep]:
        """Submit `request` and step on the calling thread until it ends, yielding its steps.

        For a scheduler that is not running its own loop (CLI). Setting `cancel` stops the
        generation before the next decode; the stream then ends without a final step.
        """
        if self._thread is not None:
            raise EngineError("stream() steps the scheduler inline; this one runs its own loop")
        handle = self.submit(request)
        try:
            while not handle.done:
                if cancel is not None and cancel.is_set():
                    handle.cancel()
                self._step_guarded()
                yield from handle.drain()
        finally:
            if not handle.done:  # the consumer stopped early: free the slot now
                handle.cancel()
                self._step_guarded()

    def start(self, name: str = "ggstation-scheduler") -> Scheduler:
        """Run the loop on a background thread (GUI, tests). The server CLI calls run()."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self.run, name=name, daemon=True)
            self._thread.start()
        return self

    def call_soon(self, fn: Callable[[], Any], slot_id: int = -1) -> Future:
        """Run fn on the scheduler's thread between two steps, once slot `slot_id` (if given)
        is idle: llama-server's control tasks (slot save, restore, erase), which must not race
        a decode. Without a running loop, fn runs at once on the caller's thread."""
        fut: Future = Future()
        if not self._looping:
            self._run_call(fn, fut)
            return fut
        with self._lock:
            self._calls.append((fn, slot_id, fut))
        self._wakeup.set()
        return fut

    @staticmethod
    def _run_call(fn: Callable[[], Any], fut: Future) -> None:
        try:
            fut.set_result(fn())
        except Exception as e:
            fut.set_exception(e)

    def _run_calls(self) -> None:
        with self._lock:
            ready = [c for c in self._calls if c[1] < 0 or not self.slots[c[1]].busy]
            for c in ready:
                self._calls.remove(c)
        for fn, _, fut in ready:
            self._run_call(fn, fut)

    def run(self) -> None:
        """The task loop; returns after stop(). Runs on the thread that owns the model."""
        self._looping = True
        while not (self._stopping.is_set() and not self._any_work()):
            if not self._any_work():
                self._wakeup.wait(0.1)
                self._wakeup.clear()
                continue
            self._step_guarded()
        self._looping = False
        self._drain_pending(SchedulerStoppedError("server is shutting down"))

    def stop(self, drain_s: float = 0.0, join_s: float = 5.0) -> None:
        """Refuse new requests; let running ones finish for up to `drain_s`, end the rest."""
        with self._lock:
            self._stopping.set()
        deadline = time.monotonic() + drain_s
        while drain_s > 0 and self._any_work() and time.monotonic() < deadline:
            time.sleep(0.02)
        for slot in self.slots:
            if slot.handle is not None:
                slot.handle.cancel()
        self._drain_pending(SchedulerStoppedError("server is shutting down"))
        self._wakeup.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(join_s)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def looping(self) -> bool:
        """The loop runs on its own thread (start()); False once it has died or stopped."""
        return self._thread is not None and self._thread.is_alive()

    def n_pending(self) -> int:
        return len(self._pending)

    def n_busy(self) -> int:
        return sum(s.busy for s in self.slots)

    def slots_info(self) -> list[dict]:
        """A snapshot for /slots and the dashboard (read without locking; values may lag)."""
        return [
            {
                "id": s.id,
                "id_task": s.last_task_id,
                "request": s.last_request,
                "n_prompt_tokens_cache": s.n_prompt_cached,
                "n_ctx": self.n_ctx_seq,
                "state": s.state.value,
                "is_processing": s.busy,
                "n_cached_tokens": len(s.cache_tokens),
                "n_prompt_tokens": len(s.prompt),
                "n_prompt_tokens_processed": s.i_prompt,
                "n_decoded": s.n_generated,
            }
            for s in self.slots
        ]

    def step(self) -> None:
        """One iteration: cancellations, admissions, one batched decode, embeddings."""
        self._reap_cancelled()
        if self._calls:
            self._wake_held(urgent=True)  # (a slot file's save or restore can take a while)
            self._run_calls()
        self._admit()
        entries = self._build_generation_batch()
        if entries:
            if any(len(e.tokens) > 1 for e in entries):  # a prompt chunk: a long step
                self._wake_held(urgent=True)
            self._run_generation(entries)
        embedding = [s for s in self.slots if s.state is SlotState.EMBEDDING]
        if embedding:
            self._wake_held(urgent=True)
        for slot in embedding:
            self._run_embedding_chunk(slot)
        self._wake_held()

    def _wake_held(self, urgent: bool = False) -> None:
        """Wake the consumers of tokens put without a wake-up: each at most about once per its
        request's wake_interval_s, unless waiting for the next step would keep its tokens
        longer (or the next step is a long one: `urgent`)."""
        now = time.perf_counter()
        for slot in self.slots:
            h = slot.handle
            if (
                h is not None
                and h.held
                and (urgent or now - h.t_woken + self._dt_step >= h.wake_interval_s)
            ):
                h.wake()

    # ------------------------------------------------------------------ admission
    def _any_work(self) -> bool:
        return bool(self._pending) or bool(self._calls) or any(s.busy for s in self.slots)

    def _step_guarded(self) -> None:
        try:
            self.step()
        except Exception as e:  # a bug in the loop itself: fail what is running, keep serving
            log.exception("scheduler step failed")
            for slot in self.slots:
                if slot.busy:
                    self._fail(slot, e)

    def _validate(self, request: Request) -> None:
        n = len(request.prompt)
        if n == 0:
            raise InvalidRequestError("the prompt is empty (no tokens)")
        if n >= self.n_ctx_seq:
            raise ContextOverflowError(n, self.n_ctx_seq)
        n_vocab = self.ctx.n_vocab
        media = request.media
        placeholders = np.zeros(n, np.bool_)
        for span in media:
            if span.start < 0 or span.end > n or placeholders[span.start : span.end].any():
                raise InvalidRequestError("image spans must lie inside the prompt, apart")
            placeholders[span.start : span.end] = True
        bad = next(
            (
                int(t)
                for i, t in enumerate(request.prompt)
                if not (0 <= int(t) < n_vocab or (placeholders[i] and int(t) < 0))
            ),
            None,
        )
        if bad is not None:
            raise InvalidRequestError(
                f"token id {bad} is out of range (vocabulary has {n_vocab} tokens)"
            )
        big = max((span.n_tokens for span in media), default=0)
        if big > self.n_batch:
            raise InvalidRequestError(
                f"an image of {big} tokens does not fit in one batch (n_batch = {self.n_batch}); "
                "raise -b/--batch-size"
            )
        if not -1 <= request.id_slot < self.n_slots:
            raise InvalidRequestError(
                f"id_slot {request.id_slot} out of range (0..{self.n_slots - 1})"
            )
        if isinstance(request, EmbeddingRequest) and request.pooling not in POOLING_TYPES:
            raise InvalidRequestError(
                f"unknown pooling {request.pooling!r}; expected one of {POOLING_TYPES}"
            )

    def _drain_pending(self, err: Exception) -> None:
        with self._lock:
            pending, self._pending = list(self._pending), collections.deque()
        for handle in pending:
            handle.finish(None if handle.cancelled else err)

    def _reap_cancelled(self) -> None:
        for slot in self.slots:
            if slot.handle is not None and slot.handle.cancelled:
                self._release(slot)
        if not self._pending:  # (read without the lock: a request put meanwhile waits a step)
            return
        with self._lock:
            if any(h.cancelled for h in self._pending):
                keep: collections.deque[RequestHandle[Any]] = collections.deque()
                for h in self._pending:
                    (h.finish() if h.cancelled else keep.append(h))
                self._pending = keep

    def _admit(self) -> None:
        while self._pending:
            with self._lock:
                free = [s for s in self.slots if not s.busy]
                handle = self._pick_pending(free) if free else None
            if handle is None:
                return
            slot = self._pick_slot(handle.request, free)
            try:
                self._assign(slot, handle)
            except Exception as e:
                log.exception("could not start request %d", handle.id)
                handle.finish(e)
                self._reset_slot(slot, clear_cache=True)

    def _pick_pending(self, free: list[_Slot]) -> RequestHandle[Any] | None:
        """The oldest pending request that can start now (pinned ones wait for their slot)."""
        free_ids = {s.id for s in free}
        for i, h in enumerate(self._pending):
            if h.request.id_slot < 0 or h.request.id_slot in free_ids:
                del self._pending[i]
                return h
        return None

    def _pick_slot(self, request: Request, free: list[_Slot]) -> _Slot:
        if request.id_slot >= 0:
            return self.slots[request.id_slot]
        if isinstance(request, GenerationRequest) and request.cache_prompt:
            best = max(
                free, key=lambda s: (common_prefix(s.cache_tokens, request.prompt), -s.t_last_used)
            )
            lcp = common_prefix(best.cache_tokens, request.prompt)
            if lcp > 0 and lcp >= self.slot_prompt_similarity * len(request.prompt):
                return best
        # no reusable prefix: least recently used, preferring an empty cache
        return min(free, key=lambda s: (len(s.cache_tokens) > 0, s.t_last_used))

    def _assign(self, slot: _Slot, handle: RequestHandle[Any]) -> None:
        req = handle.request
        n_reuse = 0
        if isinstance(req, GenerationRequest) and req.cache_prompt:
            # keep the common prefix, but always recompute the last prompt token (its logits)
            n_reuse = min(common_prefix(slot.cache_tokens, req.prompt), len(req.prompt) - 1)
            media = {m.start: m for m in req.media}
            if media or slot.cache_media:
                n_reuse = media_prefix(n_reuse, slot.cache_media, media)
        if n_reuse == 0:
            self.ctx.kv.seq_clear(slot.id)
        else:
            self.ctx.kv.seq_rm(slot.id, n_reuse, -1)
        del slot.cache_tokens[n_reuse:]
        slot.cache_media = {k: v for k, v in slot.cache_media.items() if k < n_reuse}
        slot.media = {m.start: m for m in req.media}
        slot.handle, handle.slot_id = handle, slot.id
        slot.last_request, slot.last_task_id, slot.n_prompt_cached = req, handle.id, n_reuse
        self.metrics.n_prompt_tokens_cached_total += n_reuse
        slot.prompt = list(req.prompt)
        slot.i_prompt = n_reuse
        slot.n_generated = 0
        slot.next_token = -1
        slot.embd_rows = []
        if isinstance(req, EmbeddingRequest):
            slot.state = SlotState.EMBEDDING
            slot.generator = None
            return
        slot.n_keep = self.n_keep if req.n_keep is None else req.n_keep
        # llama-server: without a context shift a reply ends when prompt + reply fill the slot
        n_room = -1 if self.context_shift else self.n_ctx_seq - len(req.prompt)
        slot.generator = SequenceGenerator(
            self.tokenizer,
            req.params,
            req.n_predict,
            req.stop,
            n_room=n_room,
            prompt_tokens=req.prompt,
            n_cached=n_reuse,
            grammar=req.grammar,
        )
        slot.state = SlotState.PROMPT
        if (
            req.return_progress
        ):  # llama-server's first report: the reused prefix, nothing decoded yet
            handle.put(PromptProgress(len(req.prompt), n_reuse, n_reuse))

    # ------------------------------------------------------------------ generation
    def _build_generation_batch(self) -> list[_Entry]:
        """Decode tokens first (one per generating slot), then prompt chunks."""
        entries = []
        budget = self._budget
        for slot in self.slots:
            if slot.state is SlotState.GENERATING and budget > 0:
                if len(slot.cache_tokens) + 1 >= self.n_ctx_seq:
                    self._shift_context(slot)
                entries.append(_Entry(slot, [slot.next_token], len(slot.cache_tokens), True))
                budget -= 1
        for slot in self.slots:
            if slot.state is SlotState.PROMPT and budget > 0:
                e = self._prompt_entry(slot, budget)
                if e.span is not None:  # an image: decoded whole, in a batch of its own
                    return [e]
                entries.append(e)
                budget -= len(e.tokens)
        return entries

    def _prompt_entry(self, slot: _Slot, budget: int) -> _Entry:
        """The slot's next piece of prompt: the image span starting there, whole, or text of
        at most `budget` tokens that stops before the next image."""
        i = slot.i_prompt
        span = slot.media.get(i)
        if span is not None:
            return _Entry(slot, slot.prompt[i : span.end], i, span.end == len(slot.prompt), span)
        chunk = slot.prompt[i : i + budget]
        nxt = min((k for k in slot.media if k > i), default=None)
        if nxt is not None:
            chunk = chunk[: nxt - i]
        return _Entry(slot, chunk, i, i + len(chunk) == len(slot.prompt))

    def _shift_context(self, slot: _Slot) -> None:
        """llama-server's context shift: keep n_keep (+ BOS) tokens, drop half of the rest,
        move what follows back (the KV cache re-ropes the moved keys)."""
        self._wake_held(urgent=True)
        n_past = len(slot.cache_tokens)
        n_keep = len(slot.prompt) if slot.n_keep < 0 else slot.n_keep
        n_keep += int(self.tokenizer.add_bos)
        n_keep = max(0, min(self.n_ctx_seq - 4, n_keep))
        n_left = n_past - n_keep
        n_discard = max(0, min(n_left // 2, n_left - 1))
        if slot.cache_media:  # never cut an image: keep it whole, or drop it whole
            for st, (_, n) in slot.cache_media.items():
                if st < n_keep < st + n:
                    n_keep = st
            end = n_keep + n_discard
            for st, (_, n) in slot.cache_media.items():
                if st < end < st + n:
                    end = st + n
            n_discard = min(end, n_past - 1) - n_keep
            slot.cache_media = {
                (st if st < n_keep else st - n_discard): v
                for st, v in slot.cache_media.items()
                if st + v[1] <= n_keep or st >= n_keep + n_discard
            }
        self.ctx.kv.seq_shift_discard(slot.id, n_keep, n_discard)
        del slot.cache_tokens[n_keep : n_keep + n_discard]
        assert slot.generator is not None
        slot.generator.truncated = True
        log.info(
            "slot %d: context shift, n_keep = %d, n_left = %d, n_discard = %d",
            slot.id,
            n_keep,
            n_left,
            n_discard,
        )

    def _decode(self, entries: list[_Entry], embeddings: bool = False) -> np.ndarray:
        parts = [
            Batch.for_sequence(
                np.asarray(e.tokens, np.int32),
                e.pos0,
                e.slot.id,
                logits_last=e.wants_logits,
                logits_all=embeddings,
            )
            for e in entries
        ]
        for i, e in enumerate(entries):
            if e.span is not None:
                cached = e.span.encoded
                embd = e.span.embed()
                if not cached:
                    log.info(
                        "slot %d: image %s encoded in %.1f ms (%d tokens)",
                        e.slot.id,
                        e.span.id[:12],
                        e.span.t_encode_ms,
                        e.span.n_tokens,
                    )
                b = parts[i]
                end = np.full(len(b), e.pos0 + len(e.tokens) - 1, np.int32)
                parts[i] = Batch(
                    b.tokens,
                    b.pos,
                    b.seq_id,
                    b.logits,
                    embd,
                    end if e.span.non_causal else None,
                )
        batch = parts[0] if len(parts) == 1 else Batch.concat(parts)
        return self.ctx.decode(batch, embeddings=embeddings)

    def _run_generation(self, entries: list[_Entry]) -> None:
        t0 = time.perf_counter()
        try:
            logits = self._decode(entries)
        except KVCacheFullError:
            self._rollback(entries)
            self._kv_full(entries)
            return
        except Exception as err:
            self._rollback(entries)
            recovered = self._recover(entries, err)
            if recovered is None:
                return
            entries, logits = recovered
        dt = time.perf_counter() - t0
        self._dt_step = dt
        self._budget = self.n_batch
        m = self.metrics
        m.n_decode_total += 1
        m.n_busy_slots_total += len(entries)
        row = 0
        for e in entries:
            slot = e.slot
            if e.span is not None:
                slot.cache_media[e.pos0] = (e.span.id, e.span.n_tokens)
            slot.cache_tokens.extend(e.tokens)
            m.n_tokens_max = max(m.n_tokens_max, len(slot.cache_tokens))
            if slot.state is SlotState.PROMPT:
                slot.i_prompt += len(e.tokens)
                m.n_prompt_tokens_total += len(e.tokens)
                m.t_prompt_s_total += dt
                if slot.handle is not None and getattr(
                    slot.handle.request, "return_progress", False
                ):
                    slot.handle.put(
                        PromptProgress(len(slot.prompt), slot.n_prompt_cached, slot.i_prompt)
                    )
            else:
                m.t_predicted_s_total += dt
            if e.wants_logits:
                self._accept(slot, logits[row])
                row += 1

    def _kv_full(self, entries: list[_Entry]) -> None:
        """A unified KV pool had no room for the batch (llama-server's decode() returning 1):
        purge one idle slot's cache, else retry with half the tokens; when even one token does
        not fit, every running request fails with "Context size has been exceeded.", as
        llama-server's do (the pool is shared, so no one request is to blame)."""
        idle = [s for s in self.slots if not s.busy and s.cache_tokens]
        if idle:
            slot = min(idle, key=lambda s: s.t_last_used)
            log.warning(
                "KV cache full: purging slot %d with %d tokens", slot.id, len(slot.cache_tokens)
            )
            self._reset_slot(slot, clear_cache=True)
            return
        if sum(len(e.tokens) for e in entries) > 1:
            self._budget = max(1, self._budget // 2)
            log.info("KV cache full: retrying with a batch of %d tokens", self._budget)
            return
        log.error("KV cache full: context size has been exceeded")
        for slot in self.slots:
            if slot.busy and slot.state is not SlotState.EMBEDDING:
                self._fail(slot, EngineError("Context size has been exceeded."))

    def _recover(
        self, entries: list[_Entry], err: Exception
    ) -> tuple[list[_Entry], np.ndarray] | None:
        """A combined decode failed: free idle caches and retry, then isolate the culprit."""
        log.warning("decode of %d sequences failed (%s); retrying", len(entries), err)
        for slot in self.slots:
            if not slot.busy and slot.cache_tokens:
                self.ctx.kv.seq_clear(slot.id)
                slot.cache_tokens = []
                slot.cache_media = {}
        ok = []
        for e in entries:
            try:
                self._decode([e])
            except Exception as err1:
                self._rollback([e])
                self._fail(
                    e.slot,
                    err1
                    if isinstance(err1, EngineError)
                    else EngineError(f"decode failed: {err1}"),
                )
                continue
            self._rollback([e])  # re-run together below for consistent bookkeeping
            ok.append(e)
        if not ok:
            return None
        try:
            return ok, self._decode(ok)
        except Exception as err2:
            self._rollback(ok)
            for e in ok:
                self._fail(e.slot, EngineError(f"decode failed: {err2}"))
            return None

    def _rollback(self, entries: list[_Entry]) -> None:
        for e in entries:
            try:
                self.ctx.kv.seq_rm(e.slot.id, e.pos0, -1)
            except Exception:
                log.exception("seq_rm after a failed decode")

    def _accept(self, slot: _Slot, logits_row: np.ndarray) -> None:
        assert slot.generator is not None and slot.handle is not None
        slot.state = SlotState.GENERATING
        try:
            step = slot.generator.accept(logits_row)
        except Exception as e:
            self._fail(slot, e)
            return
        slot.n_generated += 1
        self.metrics.n_tokens_predicted_total += 1
        slot.handle.put(step, wake=False)  # step() wakes its consumer (_wake_held)
        if step.finish_reason:
            self._release(slot)
        else:
            slot.next_token = step.token

    # ------------------------------------------------------------------ embeddings
    def _run_embedding_chunk(self, slot: _Slot) -> None:
        assert slot.handle is not None and isinstance(slot.handle.request, EmbeddingRequest)
        req = slot.handle.request
        entry = self._prompt_entry(slot, self.n_batch)
        try:
            rows = self._decode([entry], embeddings=True)
        except Exception as e:
            self._fail(slot, e)
            return
        m = self.metrics
        m.n_decode_total += 1
        m.n_busy_slots_total += 1
        m.n_prompt_tokens_total += len(entry.tokens)
        m.n_tokens_max = max(m.n_tokens_max, entry.pos0 + len(entry.tokens))
        slot.embd_rows.append(np.asarray(rows, dtype=np.float32))
        slot.i_prompt += len(entry.tokens)
        if slot.i_prompt < len(slot.prompt):
            return
        try:
            vec = pool_embeddings(np.concatenate(slot.embd_rows), req.pooling, req.normalize)
        except Exception as e:
            self._fail(slot, e)
            return
        slot.handle.put(EmbeddingResult(vec, len(slot.prompt)))
        self._release(slot, clear_cache=True)

    # ------------------------------------------------------------------ slot lifecycle
    def _fail(self, slot: _Slot, err: Exception) -> None:
        log.warning("request on slot %d failed: %s", slot.id, err)
        self.metrics.n_requests_failed += 1
        self._release(slot, err, clear_cache=True)

    def _release(
        self, slot: _Slot, error: Exception | None = None, clear_cache: bool = False
    ) -> None:
        handle = slot.handle
        self._reset_slot(slot, clear_cache)
        if handle is not None:
            handle.finish(error)

    def _reset_slot(self, slot: _Slot, clear_cache: bool) -> None:
        if clear_cache:
            try:
                self.ctx.kv.seq_clear(slot.id)
            except Exception:
                log.exception("seq_clear")
            slot.cache_tokens = []
            slot.cache_media = {}
        slot.state = SlotState.IDLE
        slot.media = {}
        slot.handle = None
        slot.generator = None
        slot.embd_rows = []
        slot.t_last_used = time.perf_counter()


__all__ = [
    "EmbeddingRequest",
    "EmbeddingResult",
    "GenerationRequest",
    "RequestHandle",
    "Scheduler",
    "SchedulerMetrics",
    "SlotState",
]
