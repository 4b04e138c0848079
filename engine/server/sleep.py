"""--sleep-idle-seconds: unload the model after N idle seconds (fractions allowed), reload it
on the next request that needs it (llama-server's sleeping state).

Sleeping frees the whole model, as llama-server's does: the context (KV cache and compute
buffers), the weights' interleaved copies and the GPU's share, the tokenizer and its grammar
vocabulary, the slots' prompt caches, and the GGUF's mapping itself (the file is no longer
mapped); then glibc is asked to hand its freed heap back (malloc_trim). What stays is a small
copy of what the read-only endpoints report (`_SleepingModel`: path, hyper-parameters,
parameter count, scalar metadata, BOS/EOS text) and the scheduler with its counters, so
/health, /props, /models and /metrics answer without waking the model, as llama-server's do
from their cached copies. Every other request wakes it first (llama-server's create_response
without bypass_sleep): the file is loaded again (load_model), with a new context of the same
parameters; slots come back with empty caches. A reload that fails (the file was moved) is a
503 and the model stays asleep: the next request tries again.

Idle means no request in flight but the read-only ones, and none for N seconds; a /metrics
scrape does not count (llama-server: metrics tasks do not reset the idle timer).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from gguf import GGUFValueType

from ..errors import APIError, EngineError

if TYPE_CHECKING:
    from fastapi import FastAPI

    from ..model import Model
    from ..seams import ModelFacts
    from .state import ServerState

log = logging.getLogger(__name__)

# GETs that answer while sleeping and do not wake the model (llama-server: bypass_sleep;
# POST /props wakes it)
READ_ONLY_PATHS = frozenset(
    {"/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics"}
)


class SleepController:
    """Watches for idleness and moves the model in and out of its sleeping state. Entering
    and leaving run on the scheduler's thread (Scheduler.call_soon), between decode steps."""

    def __init__(self, state: ServerState, idle_s: float, poll_s: float = 0.1):
        self.state = state
        self.idle_s = float(idle_s)
        self.poll_s = poll_s
        self.is_sleeping = False
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last_activity = time.monotonic()
        self._ctx_params: Any = None
        self._n_gpu_layers = 0  # what the model had offloaded (-ngl), for the reload
        # called with the new state after each change (a router's child announces it)
        self.on_change: Callable[[bool], None] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sleep-monitor", daemon=True)

    def start(self) -> SleepController:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    # -- requests ------------------------------------------------------------------------
    def begin_request(self) -> None:
        with self._lock:
            self._in_flight += 1
            self._last_activity = time.monotonic()

    def end_request(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._last_activity = time.monotonic()

    async def wake(self) -> None:
        """Reload the model if it sleeps; returns once it is awake (call after begin_request).

        Raises:
            APIError: 503 when the model cannot be loaded again (it stays asleep).
        """
        if self.is_sleeping:
            await asyncio.wrap_future(self.state.scheduler.call_soon(self._exit))

    # -- the state changes, on the scheduler's thread ----------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.state.is_ready and self.state.scheduler.stopping:
                return  # the loop is gone: nothing may unload the model from this thread
            if self.is_sleeping or not self.state.is_ready or not self._idle():
                continue
            try:
                self.state.scheduler.call_soon(self._enter).result()
            except Exception:
                log.exception("could not enter the sleeping state")
                return

    def _idle(self) -> bool:
        with self._lock:
            return self._idle_locked()

    def _idle_locked(self) -> bool:
        s = self.state.scheduler
        quiet = self._in_flight == 0 and time.monotonic() - self._last_activity >= self.idle_s
        return quiet and s.n_busy() == 0 and s.n_pending() == 0

    def _enter(self) -> None:
        if self.is_sleeping or not self._idle():
            return  # a request arrived in the meantime
        s = self.state.scheduler
        model: Any = s.model
        assert model is not None
        asleep = _SleepingModel(model)  # first, so that a failure here changes nothing
        with self._lock:  # checked and set at once: a request that begins later finds it
            if not self._idle_locked():  # asleep and waits for _exit, which runs after this
                return
            self.is_sleeping = True
        log.info("server is entering sleeping state (idle for %g s)", self.idle_s)
        self._ctx_params = s.ctx.params  # type: ignore[attr-defined]  # the engine's Context
        gpu = model.gpu
        self._n_gpu_layers = 0 if gpu is None else model.cfg.n_layer + 1 - gpu.first_layer
        for slot in s.slots:  # their caches and last requests (grammars over the vocabulary) go too
            slot.cache_tokens, slot.prompt, slot.embd_rows = [], [], []
            slot.generator = slot.last_request = None
            slot.n_prompt_cached = 0
        s.ctx = None  # type: ignore[assignment]  # no decode runs while asleep: wake() comes first
        s.model, s.tokenizer = asleep, asleep.tokenizer
        model.close()  # the GGUF's map, the weights and the GPU's buffers
        del model, gpu
        gc.collect()  # reference cycles (tracebacks, the grammar matchers) hold parts of it
        _trim_heap()
        self._changed()

    def _exit(self) -> None:
        if not self.is_sleeping:
            return
        s = self.state.scheduler
        asleep: Any = s.model
        log.info("server is exiting sleeping state")
        try:
            model, ctx = _reload(asleep, self._n_gpu_layers, self._ctx_params)
        except Exception as e:
            traceback.clear_frames(e.__traceback__)  # its frames may hold what was loaded
            log.error("cannot wake the model: %s", e)
            raise APIError(
                503, f"the model could not be loaded again after sleeping: {e}", "unavailable_error"
            ) from None
        s.model, s.tokenizer, s.ctx = model, model.tokenizer, ctx
        with self._lock:
            self.is_sleeping = False
            self._last_activity = time.monotonic()
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change(self.is_sleeping)
            except Exception:
                log.exception("sleep state callback failed")


def _reload(asleep: _SleepingModel, n_gpu_layers: int, ctx_params: Any) -> tuple[Model, Any]:
    """The model loaded again from its file, and a context of the parameters it had.

    Raises:
        EngineError (and the loader's errors): the file is gone, unreadable or another model.
    """
    from .. import jit
    from ..init import InitParams, init_from_params

    def same_model(model: Model) -> None:
        cfg = model.cfg
        if (cfg.arch, cfg.n_vocab, cfg.n_layer, cfg.n_embd) != asleep.shape:
            raise EngineError(f"{asleep.path} is another model than the one loaded at start-up")

    # the thread count chosen at start-up (None would mean every core)
    params = InitParams(ctx_params, n_threads=jit.num_threads() or None, n_gpu_layers=n_gpu_layers)
    loaded = init_from_params(asleep.path, params, check=same_model)
    return loaded.model, loaded.ctx


class _SleepingModel:
    """What the read-only endpoints read of the model (ServedModel) while it sleeps: a copy
    of its facts, holding no weight, no vocabulary and no view of the file."""

    def __init__(self, model: Model):
        self.path = model.path
        self.cfg: ModelFacts = model.cfg  # a frozen dataclass of numbers
        cfg = model.cfg
        self.shape = (cfg.arch, cfg.n_vocab, cfg.n_layer, cfg.n_embd)  # a reload must match it
        self.n_params = model.n_params
        meta = model.gguf.metadata
        self.gguf = _Metadata(
            {k: meta[k] for k in meta if meta.value_type(k)[0] != GGUFValueType.ARRAY}
        )
        self.tokenizer = _SleepingTokenizer(model.tokenizer)


class _Metadata:
    """The scalar metadata (pooling type, names...); arrays (the vocabulary) are not kept."""

    def __init__(self, values: dict[str, Any]):
        self._values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)


class _SleepingTokenizer:
    """The tokenizer facts /props and /models show; anything that needs the vocabulary is an
    error (every request that tokenizes wakes the model before it is handled)."""

    def __init__(self, tok: Any):
        self.n_vocab: int = tok.n_vocab
        self.add_bos: bool = tok.add_bos
        self.add_eos: bool = tok.add_eos
        self.bos_id: int | None = tok.bos_id
        self.eos_id: int | None = tok.eos_id
        self.eog_ids: Collection[int] = frozenset(tok.eog_ids)
        self.vocab_type: int = tok.vocab_type
        self.max_token_bytes: int = tok.max_token_bytes
        self._pieces = {
            (t, sp): tok.token_to_piece(t, special=sp)
            for t in {self.bos_id, self.eos_id}
            if t is not None and 0 <= t < self.n_vocab
            for sp in (True, False)
        }

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        piece = self._pieces.get((token_id, special))
        if piece is None:
            raise _asleep()
        return piece

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        raise _asleep()

    def decode(self, ids: Sequence[int]) -> str:
        raise _asleep()


def _asleep() -> EngineError:
    return EngineError(
        "the model is sleeping (--sleep-idle-seconds): this needs a request that wakes it"
    )


_malloc_trim: Callable[[int], int] | None = None


def _trim_heap() -> None:
    """Hand the heap's free pages back to the OS (glibc's malloc_trim; nothing elsewhere).

    glibc keeps what free() returns in its arenas. The first time the weights' copies go, they
    were mapped chunks of their own and return to the OS; but freeing them raises glibc's mmap
    threshold, so the copies the reload makes come from an arena and, freed at the next sleep,
    stay there: without this, every sleep after the first wake gave back almost nothing."""
    global _malloc_trim
    if not sys.platform.startswith("linux"):
        return
    try:
        if _malloc_trim is None:
            _malloc_trim = ctypes.CDLL(None).malloc_trim  # glibc only (musl has none)
        _malloc_trim(0)
    except (OSError, AttributeError):
        pass


class SleepMiddleware:
    """Pure ASGI: every request to a route but the read-only ones counts as activity and
    wakes the model before it is handled; the model cannot fall asleep while one is in
    flight. A path no route serves (a 404) wakes nothing, as in llama-server."""

    def __init__(self, app, controller: SleepController, routes: list):
        self.app = app
        self.controller = controller
        self.routes = routes

    def _routed(self, scope) -> bool:
        from starlette.routing import Match

        return any(r.matches(scope)[0] is not Match.NONE for r in self.routes)

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        prefix = self.controller.state.options.api_prefix.rstrip("/")
        if prefix and path.startswith(prefix):
            path = path[len(prefix) :] or "/"
        read_only = path in READ_ONLY_PATHS and scope.get("method") in ("GET", "HEAD")
        if (
            scope["type"] != "http"
            or read_only
            or not self.controller.state.is_ready
            or not self._routed(scope)
        ):
            return await self.app(scope, receive, send)
        self.controller.begin_request()
        try:
            await self.controller.wake()
            await self.app(scope, receive, send)
        finally:
            self.controller.end_request()


def install(app: FastAPI, state: ServerState, idle_s: float) -> SleepController:
    """Add sleeping to a server app: inside the gate middleware (so a request refused for its
    API key or while loading wakes nothing). Starts the idle monitor."""
    from starlette.middleware import Middleware

    controller = SleepController(state, idle_s)
    state.sleep = controller
    app.user_middleware.append(
        Middleware(
            SleepMiddleware,
            controller=controller,  # innermost
            routes=app.router.routes,
        )
    )
    return controller.start()
