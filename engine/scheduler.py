"""Scheduler: one thread owns the model context; everyone else talks to it through queues.

The loop mirrors llama.cpp's `update_slots()`: while every slot is idle it blocks on the
request queue; otherwise each step builds ONE batch from every active slot (a prompt chunk
for slots still reading their prompt, one token for each generating slot), runs a single
`ctx.decode`, and pushes a `GenerationStep` to each request's own queue. `None` ends a
stream; an `Exception` in the queue is re-raised on the consumer side.

    Slot states:   IDLE --admit--> PROMPT --prompt done--> GENERATING --finish/cancel--> IDLE
                   IDLE --admit embedding--> EMBEDDING --pooled--> IDLE

Consumers are HTTP handlers (engine.server) and the desktop app's GenerationWorker, so the
chat window and the server can share one loaded model. Nothing here knows about HTTP.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .errors import ContextOverflowError, EngineError

log = logging.getLogger(__name__)

POOLING_TYPES = ("none", "mean", "cls", "last")


class SchedulerStoppedError(EngineError):
    """The scheduler is shutting down and accepts no new requests."""


class SlotState(enum.Enum):
    IDLE = "idle"
    PROMPT = "prompt"
    GENERATING = "generating"
    EMBEDDING = "embedding"


@dataclass
class GenerationRequest:
    """One completion: already-tokenized prompt plus how to sample and when to stop.

    Args:
        prompt: token ids (BOS/template already applied by the caller).
        params: engine.sampling.SamplingParams (None = defaults).
        n_predict: maximum tokens to generate, -1 = until EOG or the slot's context is full.
        stop: stop strings (held back from the stream and not included in the text).
        cache_prompt: reuse the slot's KV for the longest common prefix.
        n_probs: number of top log-probabilities to report per token (0 = none).
        id_slot: pin to a slot (-1 = choose the slot with the longest cached prefix).
    """

    prompt: list[int]
    params: Any = None
    n_predict: int = -1
    stop: Sequence[str] = ()
    cache_prompt: bool = True
    n_probs: int = 0
    id_slot: int = -1
    extra: dict = field(default_factory=dict)  # passed to the generator factory untouched


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


@dataclass
class SchedulerMetrics:
    """Counters in the units of llama-server's /metrics."""

    n_prompt_tokens_total: int = 0
    t_prompt_s_total: float = 0.0
    n_tokens_predicted_total: int = 0
    t_predicted_s_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_requests_total: int = 0
    n_requests_failed: int = 0


_END = None  # end-of-stream marker in a handle's queue


class RequestHandle:
    """The consumer's side of one submitted request.

    Iterate it (`for step in handle`) from a thread, or `async for step in handle.astream()`
    from an event loop. `cancel()` frees the slot at the next step.
    """

    def __init__(self, request_id: int, request, scheduler: "Scheduler"):
        self.id = request_id
        self.request = request
        self.slot_id = -1
        self._scheduler = scheduler
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self.done = False

    # -- producer side (scheduler thread) --
    def _put(self, item) -> None:
        self._queue.put(item)
        loop, event = self._loop, self._event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # loop closed: the consumer is gone
                pass

    # -- consumer side --
    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop this request; its slot is freed at the next scheduler step."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._scheduler._wake()

    def __iter__(self) -> Iterator:
        while True:
            item = self._queue.get()
            if item is _END:
                self.done = True
                return
            if isinstance(item, BaseException):
                self.done = True
                raise item
            yield item

    async def astream(self):
        """Async iterator over the steps; never blocks the event loop."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        while True:
            self._event.clear()
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                await self._event.wait()
                continue
            if item is _END:
                self.done = True
                return
            if isinstance(item, BaseException):
                self.done = True
                raise item
            yield item

    def result(self) -> list:
        """Block until the request ends; all its steps (or the single EmbeddingResult)."""
        return list(self)


@dataclass
class _Slot:
    id: int
    state: SlotState = SlotState.IDLE
    handle: RequestHandle | None = None
    cache_tokens: list = field(default_factory=list)  # token ids whose KV sits in seq `id`
    prompt: list = field(default_factory=list)
    i_prompt: int = 0  # next prompt index to feed
    n_cached: int = 0
    generator: Any = None
    next_token: int = -1  # sampled, not yet fed
    n_generated: int = 0
    embd_rows: list = field(default_factory=list)
    t_start: float = 0.0
    t_prompt_done: float = 0.0
    t_last_used: float = 0.0
    n_ctx_limit: int = 0
    last_step: Any = None

    @property
    def busy(self) -> bool:
        return self.state is not SlotState.IDLE


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def pool_embeddings(rows: np.ndarray, pooling: str, normalize: int) -> np.ndarray:
    """rows: (n_tokens, n_embd) hidden states of one prompt -> pooled vector(s)."""
    if pooling == "mean":
        out = rows.mean(axis=0)
    elif pooling == "cls":
        out = rows[0]
    elif pooling == "last":
        out = rows[-1]
    elif pooling == "none":
        return np.stack([normalize_embedding(r, normalize) for r in rows])
    else:
        raise ValueError(f"unknown pooling type {pooling!r}; expected one of {POOLING_TYPES}")
    return normalize_embedding(out, normalize)


def normalize_embedding(v: np.ndarray, norm: int) -> np.ndarray:
    """llama.cpp common_embd_normalize."""
    v = np.asarray(v, dtype=np.float32)
    if norm < 0:
        return v
    if norm == 0:
        s = np.abs(v).max() / 32760.0
    elif norm == 2:
        s = float(np.sqrt(np.sum(v.astype(np.float64) ** 2)))
    else:
        s = float(np.sum(np.abs(v.astype(np.float64)) ** norm) ** (1.0 / norm))
    return v / s if s > 0 else v


def _default_generator_factory(tokenizer):
    def make(request: GenerationRequest, n_predict: int, n_cached: int):
        from .generate import SequenceGenerator
        from .sampling import SamplingParams

        params = request.params if request.params is not None else SamplingParams()
        if request.n_probs and getattr(params, "n_probs", 0) != request.n_probs:
            params = dataclasses.replace(params, n_probs=request.n_probs)
        return SequenceGenerator(
            tokenizer,
            params,
            n_predict,
            list(request.stop),
            prompt_tokens=request.prompt,
            n_cached=n_cached,
            **request.extra,
        )

    return make


class Scheduler:
    """Owns a Context; serves GenerationRequests and EmbeddingRequests from many threads.

    Args:
        ctx: engine.context.Context (or anything with decode/kv/n_ctx_seq).
        tokenizer: the model's tokenizer (used by the default generator factory).
        n_slots: parallel sequences (default: ctx's n_seq_max).
        n_batch: most tokens per decode call (default: ctx's n_batch).
        model: the loaded model, kept for callers (server /props, GUI).
        generator_factory: (request, n_predict, n_cached) -> object with .accept(row) ->
            GenerationStep. Tests inject fakes; the default is engine.generate.SequenceGenerator.
        slot_prompt_similarity: a free slot whose cached prefix covers at least this share
            of the prompt is preferred (llama.cpp -sps); otherwise the least recently used.
        context_shift: when a generating slot fills its context, drop half of the tokens
            after the first `n_keep` and go on (llama.cpp --context-shift); otherwise the
            generation ends with finish reason "length".
        n_keep: tokens kept at the start on a context shift (-1: the whole prompt).
    """

    def __init__(
        self,
        ctx,
        tokenizer=None,
        *,
        n_slots: int | None = None,
        n_batch: int | None = None,
        model=None,
        generator_factory: Callable | None = None,
        slot_prompt_similarity: float = 0.1,
        clock: Callable[[], float] = time.perf_counter,
        context_shift: bool = False,
        n_keep: int = 0,
    ):
        self.context_shift = context_shift
        self.n_keep = n_keep
        self.ctx = ctx
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        cparams = getattr(ctx, "params", None)
        self.n_slots = int(n_slots or getattr(cparams, "n_seq_max", 0) or 1)
        self.n_batch = int(n_batch or getattr(cparams, "n_batch", 0) or 2048)
        self.n_ctx_seq = int(ctx.n_ctx_seq)
        self._make_generator = generator_factory or _default_generator_factory(self.tokenizer)
        self._clock = clock
        self.slot_prompt_similarity = slot_prompt_similarity
        self.slots = [_Slot(i) for i in range(self.n_slots)]
        self.metrics = SchedulerMetrics()
        self._pending: collections.deque[RequestHandle] = collections.deque()
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self.loop_thread_id: int | None = None

    # ------------------------------------------------------------------ public API
    def submit(self, request: GenerationRequest | EmbeddingRequest) -> RequestHandle:
        """Queue a request; returns its handle at once.

        Raises:
            ContextOverflowError: the prompt does not fit in one slot's context
                (`.n_prompt_tokens` and `.n_ctx` carry the numbers).
            ValueError: empty prompt, unknown pooling, bad slot id.
            SchedulerStoppedError: the scheduler is shutting down.
        """
        self._validate(request)
        handle = RequestHandle(next(self._ids), request, self)
        with self._lock:
            if self._stopping.is_set():
                raise SchedulerStoppedError("server is shutting down")
            self._pending.append(handle)
            self.metrics.n_requests_total += 1
        self._wake()
        return handle

    def generate(self, request: GenerationRequest) -> Iterator:
        """Convenience: submit and iterate; cancels the request if the caller stops early."""
        handle = self.submit(request)
        try:
            yield from handle
        finally:
            if not handle.done:
                handle.cancel()

    def start(self, name: str = "scheduler") -> "Scheduler":
        """Run the loop on a background thread (GUI, tests). The server CLI calls run() instead."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self.run, name=name, daemon=True)
            self._thread.start()
        return self

    def run(self) -> None:
        """The task loop; returns after stop(). Call from the thread that should own the model."""
        self.loop_thread_id = threading.get_ident()
        while not (self._stopping.is_set() and not self._any_work()):
            if not self._any_work():
                self._wakeup.wait(0.1)
                self._wakeup.clear()
                continue
            try:
                self.step()
            except Exception as e:  # a bug in the loop itself: fail what is running, keep serving
                log.exception("scheduler step failed")
                for slot in self.slots:
                    if slot.busy:
                        self._fail(slot, e)
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
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(join_s)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def n_pending(self) -> int:
        return len(self._pending)

    def n_busy(self) -> int:
        return sum(s.busy for s in self.slots)

    def slots_info(self) -> list[dict]:
        """A snapshot for /slots and the dashboard (read without locking; values may lag)."""
        out = []
        for s in self.slots:
            h = s.handle
            out.append(
                {
                    "id": s.id,
                    "id_task": h.id if h is not None else -1,
                    "n_ctx": self.n_ctx_seq,
                    "state": s.state.value,
                    "is_processing": s.busy,
                    "n_cached_tokens": len(s.cache_tokens),
                    "n_prompt_tokens": len(s.prompt),
                    "n_prompt_tokens_processed": s.i_prompt,
                    "n_decoded": s.n_generated,
                }
            )
        return out

    # ------------------------------------------------------------------ internals
    def _wake(self) -> None:
        self._wakeup.set()

    def _any_work(self) -> bool:
        return bool(self._pending) or any(s.busy for s in self.slots)

    def _validate(self, request) -> None:
        n = len(request.prompt)
        if n == 0:
            raise ValueError("the prompt is empty (no tokens)")
        if n >= self.n_ctx_seq:
            err = ContextOverflowError(
                f"the request exceeds the available context size: the prompt has {n} tokens, "
                f"the slot context is {self.n_ctx_seq} tokens (try increasing -c/--ctx-size)"
            )
            err.n_prompt_tokens, err.n_ctx = n, self.n_ctx_seq
            raise err
        n_vocab = self._n_vocab()
        if n_vocab and any(not 0 <= int(t) < n_vocab for t in request.prompt):
            bad = next(int(t) for t in request.prompt if not 0 <= int(t) < n_vocab)
            raise ValueError(f"token id {bad} is out of range (vocabulary has {n_vocab} tokens)")
        if not -1 <= request.id_slot < self.n_slots:
            raise ValueError(f"id_slot {request.id_slot} out of range (0..{self.n_slots - 1})")
        if isinstance(request, EmbeddingRequest) and request.pooling not in POOLING_TYPES:
            raise ValueError(f"unknown pooling {request.pooling!r}; expected one of {POOLING_TYPES}")

    def _n_vocab(self) -> int:
        cfg = getattr(self.model, "cfg", None)
        return int(getattr(cfg, "n_vocab", 0) or getattr(self.tokenizer, "n_vocab", 0) or 0)

    def _drain_pending(self, err: Exception) -> None:
        with self._lock:
            pending, self._pending = list(self._pending), collections.deque()
        for handle in pending:
            handle._put(err if not handle.cancelled else _END)
            handle._put(_END)

    def step(self) -> None:
        """One scheduler iteration: cancellations, admissions, one batched decode."""
        self._reap_cancelled()
        self._admit()
        gen_entries = self._build_generation_batch()
        if gen_entries:
            self._run_generation(gen_entries)
        for slot in self.slots:
            if slot.state is SlotState.EMBEDDING:
                self._run_embedding_chunk(slot)

    def _reap_cancelled(self) -> None:
        for slot in self.slots:
            if slot.busy and slot.handle.cancelled:
                self._release(slot, _END)
        with self._lock:
            if any(h.cancelled for h in self._pending):
                keep = collections.deque()
                for h in self._pending:
                    (h._put(_END) if h.cancelled else keep.append(h))
                self._pending = keep

    def _admit(self) -> None:
        while True:
            with self._lock:
                free = [s for s in self.slots if not s.busy]
                if not free or not self._pending:
                    return
                handle = self._pick_pending(free)
                if handle is None:
                    return
            slot = self._pick_slot(handle.request, free)
            try:
                self._assign(slot, handle)
            except Exception as e:
                log.exception("could not start request %d", handle.id)
                handle._put(e)
                handle._put(_END)
                self._reset_slot(slot, clear_cache=True)

    def _pick_pending(self, free: list[_Slot]) -> RequestHandle | None:
        """The oldest pending request that can start now (pinned ones wait for their slot)."""
        free_ids = {s.id for s in free}
        for i, h in enumerate(self._pending):
            if h.request.id_slot < 0 or h.request.id_slot in free_ids:
                del self._pending[i]
                return h
        return None

    def _pick_slot(self, request, free: list[_Slot]) -> _Slot:
        if request.id_slot >= 0:
            return self.slots[request.id_slot]
        if isinstance(request, GenerationRequest) and request.cache_prompt:
            best = max(free, key=lambda s: (common_prefix(s.cache_tokens, request.prompt), -s.t_last_used))
            lcp = common_prefix(best.cache_tokens, request.prompt)
            if lcp > 0 and lcp >= self.slot_prompt_similarity * len(request.prompt):
                return best
        # no reusable prefix: least recently used, preferring an empty cache
        return min(free, key=lambda s: (len(s.cache_tokens) > 0, s.t_last_used))

    def _assign(self, slot: _Slot, handle: RequestHandle) -> None:
        req = handle.request
        kv = self.ctx.kv
        n_keep = 0
        if isinstance(req, GenerationRequest) and req.cache_prompt:
            # keep the common prefix, but always recompute at least the last prompt token
            n_keep = min(common_prefix(slot.cache_tokens, req.prompt), len(req.prompt) - 1)
        if n_keep == 0:
            kv.seq_clear(slot.id)
        else:
            kv.seq_rm(slot.id, n_keep, -1)
        slot.cache_tokens = slot.cache_tokens[:n_keep]
        slot.handle, handle.slot_id = handle, slot.id
        slot.prompt = list(req.prompt)
        slot.i_prompt = n_keep
        slot.n_cached = n_keep
        slot.n_generated = 0
        slot.next_token = -1
        slot.embd_rows = []
        slot.last_step = None
        slot.t_start = self._clock()
        slot.t_prompt_done = 0.0
        if isinstance(req, EmbeddingRequest):
            slot.state = SlotState.EMBEDDING
            slot.generator = None
            return
        room = self.n_ctx_seq - len(req.prompt)
        if self.context_shift:  # the context never runs out: only the request's own limit
            n_predict = req.n_predict
        else:
            n_predict = room if req.n_predict < 0 else min(req.n_predict, room)
        slot.generator = self._make_generator(req, n_predict, n_keep)
        slot.state = SlotState.PROMPT

    # -- generation ------------------------------------------------------------
    def _build_generation_batch(self) -> list[tuple[_Slot, list[int], int, bool]]:
        """[(slot, tokens, pos0, wants_logits)]: decode tokens first, then prompt chunks."""
        entries = []
        budget = self.n_batch
        for slot in self.slots:
            if slot.state is SlotState.GENERATING and budget > 0:
                if len(slot.cache_tokens) >= self.n_ctx_seq:
                    self._shift_context(slot)
                entries.append((slot, [slot.next_token], len(slot.cache_tokens), True))
                budget -= 1
        for slot in self.slots:
            if slot.state is SlotState.PROMPT and budget > 0:
                chunk = slot.prompt[slot.i_prompt : slot.i_prompt + budget]
                last = slot.i_prompt + len(chunk) == len(slot.prompt)
                entries.append((slot, chunk, slot.i_prompt, last))
                budget -= len(chunk)
        return entries

    def _shift_context(self, slot: _Slot) -> None:
        """Drop half of what follows the kept prefix (llama.cpp's n_discard) and re-rope."""
        n_past = len(slot.cache_tokens)
        n_keep = len(slot.prompt) if self.n_keep < 0 else self.n_keep
        add_bos = getattr(self.tokenizer, "add_bos", False)
        n_keep = min(n_keep + int(bool(add_bos) and self.n_keep >= 0), n_past - 2)
        n_discard = (n_past - n_keep) // 2
        self.ctx.kv.seq_shift_discard(slot.id, n_keep, n_discard)
        slot.cache_tokens = slot.cache_tokens[:n_keep] + slot.cache_tokens[n_keep + n_discard :]
        log.info("slot %d: context shift, kept %d, discarded %d", slot.id, n_keep, n_discard)

    def _make_batch(self, entries):
        from .batch import Batch

        parts = [
            Batch.for_sequence(
                np.asarray(toks, dtype=np.int32), pos0, slot.id, logits_last=wants
            )
            for slot, toks, pos0, wants in entries
        ]
        return parts[0] if len(parts) == 1 else Batch.concat(parts)

    def _decode(self, entries, embeddings: bool = False):
        batch = self._make_batch(entries)
        if embeddings:
            return self.ctx.decode(batch, embeddings=True)
        return self.ctx.decode(batch)

    def _run_generation(self, entries) -> None:
        t0 = self._clock()
        try:
            logits = self._decode(entries)
        except Exception as e:
            self._rollback(entries)
            logits = self._recover(entries, e)
            if logits is None:
                return
        self.metrics.n_decode_total += 1
        self.metrics.n_busy_slots_total += len(entries)
        dt = self._clock() - t0
        row = 0
        for slot, toks, pos0, wants in entries:
            slot.cache_tokens.extend(toks)
            if slot.state is SlotState.PROMPT:
                slot.i_prompt += len(toks)
                self.metrics.n_prompt_tokens_total += len(toks)
                self.metrics.t_prompt_s_total += dt
            else:
                self.metrics.t_predicted_s_total += dt
            if wants:
                self._accept(slot, logits[row])
                row += 1

    def _recover(self, entries, err: Exception):
        """A combined decode failed: free idle caches and retry, then isolate the culprit."""
        log.warning("decode of %d sequences failed (%s); retrying", len(entries), err)
        for slot in self.slots:
            if not slot.busy and slot.cache_tokens:
                self.ctx.kv.seq_clear(slot.id)
                slot.cache_tokens = []
        ok = []
        for entry in entries:
            try:
                self._decode([entry])
            except Exception as e:
                self._rollback([entry])
                self._fail(entry[0], e if isinstance(e, EngineError) else EngineError(f"decode failed: {e}"))
                continue
            self._rollback([entry])  # re-run together below for consistent bookkeeping
            ok.append(entry)
        if not ok:
            return None
        entries[:] = ok
        try:
            return self._decode(ok)
        except Exception as e:
            self._rollback(ok)
            for slot, *_ in ok:
                self._fail(slot, EngineError(f"decode failed: {e}"))
            return None

    def _rollback(self, entries) -> None:
        for slot, toks, pos0, wants in entries:
            try:
                self.ctx.kv.seq_rm(slot.id, pos0, -1)
            except Exception:
                log.exception("seq_rm after a failed decode")

    def _accept(self, slot: _Slot, logits_row) -> None:
        now = self._clock()
        if slot.state is SlotState.PROMPT:
            slot.state = SlotState.GENERATING
            slot.t_prompt_done = now
        try:
            step = slot.generator.accept(logits_row)
        except Exception as e:
            self._fail(slot, e)
            return
        slot.n_generated += 1
        step = self._annotate(slot, step, now)
        slot.last_step = step
        self.metrics.n_tokens_predicted_total += 1
        slot.handle._put(step)
        if step.finish_reason:
            self._release(slot, _END)
        else:
            slot.next_token = int(step.token)

    def _annotate(self, slot: _Slot, step, now: float):
        """Fill the numbers only the scheduler knows (prompt size, cache reuse, timings)."""
        fields = {
            "n_prompt": len(slot.prompt),
            "n_cached": slot.n_cached,
            "t_prompt_ms": (slot.t_prompt_done - slot.t_start) * 1e3,
            "t_gen_ms": (now - slot.t_prompt_done) * 1e3,
        }
        fields = {k: v for k, v in fields.items() if hasattr(step, k)}
        if dataclasses.is_dataclass(step):
            return dataclasses.replace(step, **fields)
        for k, v in fields.items():
            setattr(step, k, v)
        return step

    # -- embeddings ------------------------------------------------------------
    def _run_embedding_chunk(self, slot: _Slot) -> None:
        req: EmbeddingRequest = slot.handle.request
        chunk = slot.prompt[slot.i_prompt : slot.i_prompt + self.n_batch]
        entry = (slot, chunk, slot.i_prompt, True)
        try:
            batch = self._make_batch([entry])
            batch.logits[:] = True  # every position: pooling needs them all
            rows = self.ctx.decode(batch, embeddings=True)
        except Exception as e:
            self._fail(slot, e)
            return
        self.metrics.n_decode_total += 1
        self.metrics.n_prompt_tokens_total += len(chunk)
        slot.embd_rows.append(np.asarray(rows, dtype=np.float32))
        slot.i_prompt += len(chunk)
        if slot.i_prompt < len(slot.prompt):
            return
        try:
            vec = pool_embeddings(np.concatenate(slot.embd_rows), req.pooling, req.normalize)
        except Exception as e:
            self._fail(slot, e)
            return
        slot.handle._put(EmbeddingResult(vec, len(slot.prompt)))
        self._release(slot, _END, clear_cache=True)

    # -- slot lifecycle --------------------------------------------------------
    def _fail(self, slot: _Slot, err: Exception) -> None:
        log.warning("request on slot %d failed: %s", slot.id, err)
        self.metrics.n_requests_failed += 1
        self._release(slot, err, clear_cache=True)

    def _release(self, slot: _Slot, final, clear_cache: bool = False) -> None:
        handle = slot.handle
        self._reset_slot(slot, clear_cache)
        if handle is not None:
            if final is not _END:
                handle._put(final)
            handle._put(_END)

    def _reset_slot(self, slot: _Slot, clear_cache: bool) -> None:
        if clear_cache:
            try:
                self.ctx.kv.seq_clear(slot.id)
            except Exception:
                log.exception("seq_clear")
            slot.cache_tokens = []
        slot.state = SlotState.IDLE
        slot.handle = None
        slot.generator = None
        slot.embd_rows = []
        slot.t_last_used = self._clock()
