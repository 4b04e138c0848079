"""--sleep-idle-seconds: unload the model after N idle seconds, reload it on the next request
that needs it (llama-server's sleeping state).

What sleeping frees: the context (KV cache and compute buffers, the largest anonymous
allocations), the weight views and the resident pages of the weight mapping. What stays: the
GGUF's metadata and tensor table (still mapped, not resident), the tokenizer and the
scheduler with its counters, so /health, /props, /models and /metrics answer without waking
the model, as llama-server's do from their cached copies. Every other request wakes it first
(llama-server's create_response without bypass_sleep): weights re-bound, a new context of
the same parameters; slots come back with empty caches.

Idle means no request in flight but the read-only ones, and none for N seconds; a /metrics
scrape does not count (llama-server: metrics tasks do not reset the idle timer).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import mmap
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

    from .state import ServerState

log = logging.getLogger(__name__)

# GETs that answer while sleeping and do not wake the model (llama-server: bypass_sleep;
# POST /props wakes it)
READ_ONLY_PATHS = frozenset({"/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics"})


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
        """Reload the model if it sleeps; returns once it is awake (call after begin_request)."""
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
        s = self.state.scheduler
        with self._lock:
            quiet = self._in_flight == 0 and time.monotonic() - self._last_activity >= self.idle_s
        return quiet and s.n_busy() == 0 and s.n_pending() == 0

    def _enter(self) -> None:
        if self.is_sleeping or not self._idle():
            return  # a request arrived in the meantime
        s = self.state.scheduler
        model = s.model
        assert model is not None
        log.info("server is entering sleeping state (idle for %.0f s)", self.idle_s)
        with self._lock:
            self.is_sleeping = True
        self._ctx_params = s.ctx.params  # type: ignore[attr-defined]  # the engine's Context
        for slot in s.slots:  # their cache goes with the context
            slot.cache_tokens = []
        s.ctx = None  # type: ignore[assignment]  # no decode runs while asleep: wake() comes first
        model.weights = None  # type: ignore[attr-defined]
        gc.collect()
        _release_pages(model.gguf)
        self._changed()

    def _exit(self) -> None:
        if not self.is_sleeping:
            return
        from ..context import Context
        from ..models.base import load_weights

        s = self.state.scheduler
        model: Any = s.model
        log.info("server is exiting sleeping state")
        model.weights = load_weights(model.gguf, model.cfg, model.arch.load_layer)
        s.ctx = Context(model, self._ctx_params)
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


def _release_pages(gguf: Any) -> None:
    """Drop the resident pages of the weight mapping(s): read-only file pages, so the OS
    re-reads them on the next touch. Best effort (no madvise on some platforms)."""
    for f in [gguf, *getattr(gguf, "shards", ())]:
        mm = getattr(getattr(f, "_map", None), "_mmap", None)
        try:
            if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
                mm.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):
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
            path = path[len(prefix):] or "/"
        read_only = path in READ_ONLY_PATHS and scope.get("method") in ("GET", "HEAD")
        if scope["type"] != "http" or read_only or not self.controller.state.is_ready or not self._routed(scope):
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
    app.user_middleware.append(Middleware(SleepMiddleware, controller=controller,  # innermost
                                          routes=app.router.routes))
    return controller.start()
