"""Router mode: `ggstation serve` without -m supervises one child server per model.

Each model has a status (after llama.cpp's server-models.h):

    UNLOADED --load()--> LOADING --child prints {"event": "ready"}--> LOADED
    LOADING / LOADED --unload(), eviction, reload--> (stopping) --child exits--> UNLOADED
    LOADED --child prints {"event": "sleeping"}--> SLEEPING --{"event": "ready"}--> LOADED
    LOADING / LOADED --child exits by itself, misses heartbeats or a load deadline--> UNLOADED,
                                                   with its exit code: reported as failed

A child is `python -m engine serve <the model's flags> --host 127.0.0.1 --port 0 --ready-json`
with a random internal API key. It reports start-up milestones and heartbeats as JSON lines on
stdout; the router stops it with an "exit" line on stdin (terminate after the model's
stop-timeout), and a child whose stdin closes (the router died) exits by itself. One monitor
thread reads every child's stdout and notices crashes.

Scheduling, after llama.cpp's server_lru_sched: with `models_max` N at most N children run
(loading, loaded or still stopping). A request for a model that is not running joins a FIFO
queue; requests for the same model share one entry, so they need one slot and one load. While
queued entries outnumber the free slots, idle models are stopped, least recently used first; a
model serving a request (`req_count` > 0), still coming up, or wanted by a queue entry is
never stopped. The entry at the head loads its model once a slot has really freed. A request
whose client leaves while queued leaves the queue, and an entry nobody waits for any more is
dropped, so no model is stopped for nobody. Proxying is plain HTTP (engine/router/proxy.py).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import secrets
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EngineError, ModelLimitError, RequestCancelled, RouterError, UnknownModelError
from .hub_access import HubAccess
from .presets import DEFAULT_STOP_TIMEOUT_S, ModelSpec

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
HEARTBEAT_TIMEOUT_S = 60.0  # generous: a child compiling kernels may hold the GIL a while
STOP_TIMEOUT_S = 5.0  # router shutdown: how long children get before they are terminated
FAKE_TIMING_S = (
    2.0  # LLAMA_SERVER_DEBUG_FAKE_TIMING: llama-server's test hook, slows loads and requests
)
WAIT_POLL_S = 0.2


class ModelStatus(enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    SLEEPING = (
        "sleeping"  # loaded, its model unloaded after --sleep-idle-seconds; a request wakes it
    )
    DOWNLOADING = "downloading"  # POST /models: into the cache, then listed by the next reload
    DOWNLOADED = "downloaded"


RUNNING = (ModelStatus.LOADING, ModelStatus.LOADED, ModelStatus.SLEEPING)
SERVING = (ModelStatus.LOADED, ModelStatus.SLEEPING)  # takes requests


@dataclass(eq=False)
class ChildServer:
    """One model and, while it runs, its child process."""

    name: str
    path: Path
    status: ModelStatus = ModelStatus.UNLOADED
    proc: subprocess.Popen | None = None
    port: int = 0
    api_key: str = ""
    spec: ModelSpec | None = None
    last_used: float = 0.0
    last_heartbeat: float = 0.0
    exit_code: int = 0
    error: str = ""
    t_spawn: float = 0.0
    stopping: bool = False
    stop_deadline: float = float("inf")
    req_count: int = 0  # requests being proxied to it right now
    args: list[str] = field(default_factory=list)  # the command line it was started with
    loaded_info: dict | None = None  # its own /v1/models entry, merged into the router's listing
    progress: dict | None = None  # while downloading: {url: {"done": bytes, "total": bytes}}
    cancel: threading.Event | None = None  # set to stop a download
    _stdout_buf: bytes = b""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.status in RUNNING

    @property
    def failed(self) -> bool:
        return self.status is ModelStatus.UNLOADED and self.exit_code != 0

    def info(self) -> dict:
        """The `status` object of GET /models, as llama-server reports it."""
        d: dict[str, object] = {"value": self.status.value, "args": self.args}
        if self.spec is not None and self.spec.preset_ini:
            d["preset"] = self.spec.preset_ini
        if self.progress is not None and self.status is ModelStatus.DOWNLOADING:
            d["progress"] = self.progress
        if self.failed:
            d.update(exit_code=self.exit_code, failed=True)
            if self.error:
                d["error"] = self.error
        return d


def discover_models(directory: Path) -> dict[str, Path]:
    """name (file name without .gguf) -> path, for every .gguf in `directory`."""
    if not directory.is_dir():
        return {}
    return {p.name[: -len(".gguf")]: p for p in sorted(directory.glob("*.gguf")) if p.is_file()}


def spec_for_file(name: str, path: Path | str) -> ModelSpec:
    """A model given as a bare file, with no preset."""
    return ModelSpec(
        name=name, source="models_dir", path=str(path), options=(("--model", str(path)),)
    )


@dataclass
class _Entry:
    """One model wanted by queued requests."""

    model: str
    waiters: int = 1
    loading: bool = False  # one of its waiters is loading it right now


class Router:
    """Starts, watches, schedules and stops child servers.

    Args:
        models: model name -> GGUF path or ModelSpec (ignored when `catalogue` is given).
        child_args: extra `ggstation serve` flags for every child, after the model's own.
        models_max: most models running at once (0 = unlimited).
        autoload: load a model on its first request (else only POST /models/load does).
        load_timeout_s: a child not ready by then is killed (its load failed).
        catalogue: builds the models (engine/router/presets.py); called again by reload().
        fake_timing: llama-server's LLAMA_SERVER_DEBUG_FAKE_TIMING (default: from the
            environment): every load and every proxied request takes 2 s longer, so tests can
            see requests queue.
    """

    def __init__(
        self,
        models: Mapping[str, Path | str | ModelSpec] | None = None,
        child_args: list[str] | None = None,
        *,
        models_max: int = 4,
        autoload: bool = True,
        load_timeout_s: float = 600.0,
        catalogue: Callable[[], dict[str, ModelSpec]] | None = None,
        fake_timing: bool | None = None,
        hub: HubAccess | None = None,
    ):
        self._catalogue = catalogue
        specs = (
            catalogue()
            if catalogue is not None
            else {
                name: m if isinstance(m, ModelSpec) else spec_for_file(name, m)
                for name, m in (models or {}).items()
            }
        )
        self.children = {name: self._new_child(spec) for name, spec in specs.items()}
        self.child_args = list(child_args or [])
        self.models_max = models_max
        n_startup = sum(spec.load_on_startup for spec in specs.values())
        if 0 < models_max < n_startup:
            raise RouterError(
                f"{n_startup} models have load-on-startup, more than --models-max {models_max}"
            )
        self.autoload = autoload
        self.load_timeout_s = load_timeout_s
        if fake_timing is None:
            fake_timing = bool(os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING"))
        self.fake_timing = fake_timing
        self._cv = threading.Condition(threading.RLock())
        self._queue: list[_Entry] = []
        self._reloading = False
        self.need_reload = False  # a download finished: the next listing builds the catalogue again
        self.hub = hub or HubAccess()
        self._subscribers: list[Callable[[dict], None]] = []
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._monitor = threading.Thread(
            target=self._monitor_loop, name="router-monitor", daemon=True
        )

    @staticmethod
    def _new_child(spec: ModelSpec) -> ChildServer:
        return ChildServer(spec.name, Path(spec.path), spec=spec)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Router:
        self._monitor.start()
        return self

    def load_startup_models(self) -> None:
        """Load the models whose preset says load-on-startup (in the background)."""
        for child in list(self.children.values()):
            if child.spec is not None and child.spec.load_on_startup:
                threading.Thread(target=self._load_quietly, args=(child.name,), daemon=True).start()

    def _load_quietly(self, name: str) -> None:
        try:
            self.load(name)
        except RouterError as e:
            log.warning("load-on-startup %s: %s", name, e)

    def stop(self) -> None:
        """Stop every child (graceful "exit" line, then terminate) and the monitor."""
        with self._cv:
            running = [c for c in self.children.values() if c.proc is not None]
            for child in running:
                self._request_stop(child)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in running:
            self._reap(child, max(0.1, deadline - time.monotonic()))
        self._stop.set()

    # -- lookups -----------------------------------------------------------------------------
    def get(self, name: str) -> ChildServer:
        """The model called `name` (or with that alias, or that file name).

        Raises:
            UnknownModelError: no such model.
        """
        with self._cv:
            child = self.children.get(name)
            if child is not None:
                return child
            for c in self.children.values():
                if c.spec is not None and name in c.spec.aliases:
                    return c
            for c in self.children.values():
                if c.path.name == name:
                    return c
        raise UnknownModelError(f"model '{name}' not found")

    def models_info(self) -> list[dict]:
        """GET /models entries (without the fields the proxy adds), hidden models left out."""
        with self._cv:
            out = []
            for c in self.children.values():
                if c.spec is not None and c.spec.hidden:
                    continue
                spec = c.spec or spec_for_file(c.name, c.path)
                if not c.args:
                    c.args = self._command(c, 0)
                out.append(
                    {
                        "id": c.name,
                        "aliases": list(spec.aliases),
                        "tags": list(spec.tags),
                        "path": str(c.path),
                        "status": c.info(),
                        "source": spec.source,
                        "can_remove": spec.source == "cache",
                        "_loaded_info": c.loaded_info if c.status in SERVING else None,
                    }
                )
            return out

    # -- explicit load / unload ----------------------------------------------------------------
    def load(self, name: str) -> ChildServer:
        """Start the child for `name` unless it runs already; returns once it is spawned.

        When --models-max models run, the least recently used idle one is stopped first.

        Raises:
            UnknownModelError; ModelLimitError when no running model can be stopped.
        """
        if self.fake_timing:
            time.sleep(FAKE_TIMING_S)  # outside the lock: other requests keep moving
        self.get(name)
        self._unload_lru()
        with self._cv:
            self._cv.wait_for(lambda: not self._reloading)
            child = self.get(name)
            if child.status is not ModelStatus.UNLOADED:
                return child
            if self.models_max > 0 and self._count_running() >= self.models_max:
                raise ModelLimitError("model limit reached, try again later")
            self._spawn(child)
            self._cv.notify_all()
            return child

    def unload(self, name: str, wait: bool = False) -> None:
        """Stop the child for `name` (a loading one is killed); `wait` for it to exit.

        Raises:
            UnknownModelError; RouterError when it is not running.
        """
        with self._cv:
            child = self.get(name)
            if child.status is ModelStatus.DOWNLOADING and child.cancel is not None:
                child.cancel.set()  # llama-server: unloading a download cancels it
                self._cv.wait_for(lambda: child.status is not ModelStatus.DOWNLOADING, timeout=30)
                return
            if not child.running:
                raise RouterError(f"model '{child.name}' is not running")
            self._stop_child(child)
        if wait:
            self._reap(child, child.spec.stop_timeout if child.spec else DEFAULT_STOP_TIMEOUT_S)

    def reload(self) -> None:
        """Build the catalogue again: running models whose source or options changed, or that
        are gone, are stopped; the others take their new options; new models are added.

        Raises:
            RouterError: the catalogue cannot be built (the current one stays).
        """
        if self._catalogue is None:
            return
        self.need_reload = False
        specs = self._catalogue()
        with self._cv:
            self._reloading = True
            try:
                stale = [
                    c
                    for c in self.children.values()
                    if c.running and (c.name not in specs or _changed(c.spec, specs[c.name]))
                ]
                for c in stale:
                    log.info("reload: stopping %s (its source changed or is gone)", c.name)
                    self._stop_child(c)
                longest = max(
                    (c.spec.stop_timeout if c.spec else DEFAULT_STOP_TIMEOUT_S for c in stale),
                    default=0,
                )
                self._cv.wait_for(lambda: not any(c.running for c in stale), timeout=longest + 5)
                for name in [
                    n
                    for n, c in self.children.items()
                    if n not in specs and not c.running and c.status is not ModelStatus.DOWNLOADING
                ]:
                    del self.children[name]
                for name, spec in specs.items():
                    child = self.children.get(name)
                    if child is None or child.status is ModelStatus.DOWNLOADED:
                        self.children[name] = self._new_child(spec)
                    elif child.status is ModelStatus.DOWNLOADING:
                        continue
                    elif not child.running:
                        child.spec, child.path, child.args = spec, Path(spec.path), []
                        child.exit_code, child.error = 0, ""  # a failed model may be retried
                    else:
                        child.spec = spec  # unchanged options; hidden may have changed
            finally:
                self._reloading = False
                self._cv.notify_all()
        self._notify("models_reload", "*")

    # -- the cache -------------------------------------------------------------------------------
    def download(self, spec: str) -> None:
        """Start downloading "user/repo[:QUANT]" into the cache (POST /models); returns once it
        started. Progress, then download_finished or download_failed, go to the subscribers;
        the finished model is listed after the next reload.

        Raises:
            RouterError: the name is taken, or the Hub does not have it (or cannot be reached).
        """
        if self._find_child(spec) is not None:
            raise RouterError(f"model '{spec}' already exists")
        try:
            file, url = self.hub.validate(spec)
        except EngineError as e:
            raise RouterError(f"model validation failed, unable to download: {e}") from None
        with self._cv:
            if self._find_child(spec) is not None:
                raise RouterError(f"model '{spec}' already exists")
            child = ChildServer(
                spec,
                Path(""),
                status=ModelStatus.DOWNLOADING,
                spec=ModelSpec(spec, "cache", "", ()),
                progress={},
                cancel=threading.Event(),
            )
            self.children[spec] = child
        self._notify("model_status", spec, {"status": "downloading"})
        threading.Thread(
            target=self._fetch, args=(child, file, url), name="router-download", daemon=True
        ).start()

    def _fetch(self, child: ChildServer, file: object, url: str) -> None:
        last = [0.0]

        def progress(done: int, total: int) -> None:
            child.progress = {url: {"done": done, "total": total}}
            now = time.monotonic()
            if now - last[0] >= 0.2 or done >= total:
                last[0] = now
                self._notify("download_progress", child.name, child.progress)

        assert child.cancel is not None
        try:
            self.hub.fetch(file, progress, child.cancel)
            ok = True
        except (
            Exception
        ) as e:  # any failure ends the download the same way: reported, entry dropped
            log.warning("download of %s failed: %s", child.name, e)
            ok = False
        with self._cv:
            child.status = ModelStatus.DOWNLOADED
            self.need_reload = True
            self._cv.notify_all()
        self._notify("download_finished" if ok else "download_failed", child.name, {})

    def remove(self, name: str) -> None:
        """Delete a cached model from disk (DELETE /models), stopping or cancelling it first.

        Raises:
            UnknownModelError; RouterError when it does not come from the cache.
        """
        with self._cv:
            child = self.get(name)
            if child.spec is None or child.spec.source != "cache":
                raise RouterError(f"model '{child.name}' is not removable (not from the cache)")
            if child.status is ModelStatus.DOWNLOADING and child.cancel is not None:
                child.cancel.set()
            elif child.running:
                self._stop_child(child)
            self._cv.wait_for(
                lambda: child.status in (ModelStatus.UNLOADED, ModelStatus.DOWNLOADED), timeout=30
            )
        if not self.hub.remove(child.name):
            log.warning("removing %s: no cached files were found", child.name)
        with self._cv:
            if self.children.get(child.name) is child:
                del self.children[child.name]
        self._notify("model_remove", child.name, {})

    def _find_child(self, name: str) -> ChildServer | None:
        try:
            return self.get(name)
        except UnknownModelError:
            return None

    # -- requests --------------------------------------------------------------------------------
    def acquire(
        self,
        name: str,
        *,
        autoload: bool | None = None,
        should_stop: Callable[[], bool] | None = None,
        touch: bool = True,
    ) -> ChildServer:
        """The LOADED child for `name`, counted busy until release(); loads it first (queued
        behind --models-max) when autoload is on.

        Raises:
            UnknownModelError; RouterError (not loaded and no autoload, load failed);
            RequestCancelled when should_stop() turns true while waiting.
        """
        autoload = self.autoload if autoload is None else autoload
        with self._cv:
            child = self.get(name)
            name = child.name
            if not autoload and not child.running:
                raise RouterError("model is not loaded")
            child = self._wait_ready(name, autoload, should_stop)
            child.req_count += 1
            if touch:
                child.last_used = time.monotonic()
        if self.fake_timing:
            time.sleep(FAKE_TIMING_S)  # after req_count++: the model counts as busy meanwhile
        return child

    def release(self, child: ChildServer) -> None:
        """A request acquire() granted has ended."""
        with self._cv:
            if child.req_count > 0:
                child.req_count -= 1
                if child.req_count == 0:
                    self._tick()
            self._cv.notify_all()

    def ensure_ready(self, name: str, timeout: float | None = None) -> ChildServer:
        """Load `name` if needed and wait until it is LOADED (no request is held).

        Raises:
            as acquire(); RouterError when `timeout` seconds pass first.
        """
        deadline = time.monotonic() + (self.load_timeout_s if timeout is None else timeout)
        with self._cv:
            try:
                child = self._wait_ready(
                    self.get(name).name, True, lambda: time.monotonic() > deadline
                )
            except RequestCancelled:
                raise RouterError(f"model '{name}' did not become ready in time") from None
            child.last_used = time.monotonic()
            return child

    def _wait_ready(
        self, name: str, autoload: bool, should_stop: Callable[[], bool] | None
    ) -> ChildServer:
        """Called with the lock held once; returns with it held. The queue protocol of the
        module docstring: join, wait for the model or for our turn to load it, leave."""
        queued = did_load = saw_loading = False

        def enqueue() -> None:
            nonlocal queued
            if not queued:
                self._join(name)
                self._tick()
                queued = True

        try:
            while True:
                child = self.children.get(name)
                if child is None:
                    raise UnknownModelError(f"model '{name}' not found (removed by a reload)")
                if child.stopping:  # a stopping child takes no new request; the next one will
                    enqueue()
                elif child.status in SERVING:
                    break
                elif child.status is ModelStatus.LOADING:
                    saw_loading = True
                elif child.status in (ModelStatus.DOWNLOADING, ModelStatus.DOWNLOADED):
                    raise RouterError(f"model '{name}' is not loaded (it is being downloaded)")
                elif did_load or saw_loading:  # it came up and went down again
                    if child.failed:
                        raise RouterError(
                            f"model '{name}' failed to load: "
                            f"{child.error or f'exit code {child.exit_code}'}"
                        )
                    did_load = saw_loading = False
                    enqueue()
                elif not autoload:
                    raise RouterError("model is not loaded")
                else:
                    enqueue()
                if should_stop is not None and should_stop():
                    raise RequestCancelled(f"request cancelled while waiting for model '{name}'")
                if (
                    child.status is ModelStatus.UNLOADED
                    and not child.stopping
                    and self._try_claim(name)
                ):
                    ok = False
                    self._cv.release()
                    try:
                        self.load(name)
                        ok = did_load = True
                    except UnknownModelError:
                        raise
                    except RouterError as e:
                        log.info(
                            "queued load of %s did not go through (%s); staying in line", name, e
                        )
                    finally:
                        self._cv.acquire()
                        self._claim_done(name, ok)
                        self._tick()
                    continue
                self._cv.wait(WAIT_POLL_S)
        except BaseException:
            if queued:
                self._leave(name)
            self._tick()  # a slot freed for this waiter goes to the next one
            raise
        if queued:
            self._leave(name)
        return child

    # -- scheduling (lock held) --------------------------------------------------------------------
    def _count_running(self) -> int:
        return sum(c.running for c in self.children.values())

    def _has_capacity(self) -> bool:
        return self.models_max <= 0 or self._count_running() < self.models_max

    def _find(self, name: str) -> _Entry | None:
        return next((e for e in self._queue if e.model == name), None)

    def _pick_victim(self) -> ChildServer | None:
        """The least recently used model nobody needs now: loaded, idle, not stopping, not queued for."""
        idle = [
            c
            for c in self.children.values()
            if c.status in SERVING
            and c.req_count == 0
            and not c.stopping
            and self._find(c.name) is None
        ]
        return min(idle, key=lambda c: c.last_used, default=None)

    def _join(self, name: str) -> None:
        entry = self._find(name)
        if entry is not None:
            entry.waiters += 1
        else:
            self._queue.append(_Entry(name))
        log.info("request for %s queued (%d in the queue)", name, len(self._queue))

    def _leave(self, name: str) -> None:
        entry = self._find(name)
        if entry is not None:
            entry.waiters -= 1
            if entry.waiters <= 0:
                self._queue.remove(entry)

    def _try_claim(self, name: str) -> bool:
        """True when `name` is at the head of the queue, nobody loads it yet, and a slot is free."""
        if not self._queue or self._queue[0].model != name or self._queue[0].loading:
            return False
        if not self._has_capacity():
            return False
        self._queue[0].loading = True
        return True

    def _claim_done(self, name: str, ok: bool) -> None:
        entry = self._find(name)
        if entry is not None and not ok:
            entry.loading = False  # back in line

    def _tick(self) -> None:
        """Stop idle models while queued entries outnumber the slots free or being freed."""
        if self.models_max <= 0 or not self._queue:
            return
        running = [c for c in self.children.values() if c.running]
        n_stopping = sum(c.stopping for c in running)
        n_needed = sum(not e.loading for e in self._queue)
        n_claimed = sum(
            e.loading and not (e.model in self.children and self.children[e.model].running)
            for e in self._queue
        )  # claimed a slot, not spawned yet
        n_free = self.models_max - len(running) + n_stopping - n_claimed
        while n_free < n_needed:
            victim = self._pick_victim()
            if victim is None:
                return  # every running model is busy: a request ending ticks again
            log.info("stopping idle %s (least recently used) for a queued request", victim.name)
            self._request_stop(victim)
            n_free += 1

    def _unload_lru(self) -> None:
        """No free slot: stop the least recently used idle model and wait until it has exited."""
        if self.models_max <= 0:
            return
        with self._cv:
            if self._has_capacity():
                return
            victim = self._pick_victim()
            if victim is None:
                return
            log.info(
                "--models-max %d reached: stopping %s (least recently used)",
                self.models_max,
                victim.name,
            )
            self._request_stop(victim)
            timeout = (victim.spec.stop_timeout if victim.spec else DEFAULT_STOP_TIMEOUT_S) + 5
            self._cv.wait_for(lambda: not victim.running, timeout=timeout)

    # -- events --------------------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[dict], None]) -> Callable[[], None]:
        """Call `callback(event)` for every GET /models/sse event; returns the unsubscriber."""
        with self._cv:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._cv:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def _notify(self, event: str, model: str, data: dict | None = None) -> None:
        msg: dict[str, object] = {"model": model, "event": event}
        if data is not None:
            msg["data"] = data
        with self._cv:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback(msg)
            except Exception:  # a subscriber's failure is its own
                log.debug("SSE subscriber failed", exc_info=True)

    # -- children ----------------------------------------------------------------------------------
    def _command(self, child: ChildServer, port: int) -> list[str]:
        spec = child.spec or spec_for_file(child.name, child.path)
        return [
            *_engine_command(),
            "serve",
            *spec.args(),
            *self.child_args,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--ready-json",
            "--alias",
            child.name,
        ]

    def _spawn(self, child: ChildServer) -> None:
        child.api_key = secrets.token_hex(
            24
        )  # never starts with "-", which argparse would take for a flag
        child.args = cmd = self._command(child, 0)
        env = dict(os.environ, LLAMA_API_KEY=child.api_key)
        env.pop("LLAMA_SERVER_DEBUG_FAKE_TIMING", None)  # the router fakes the timing, once
        child.proc = proc = self._popen(child, cmd, env)
        child.status, child.exit_code, child.error, child.port = ModelStatus.LOADING, 0, "", 0
        child.stopping, child.stop_deadline, child.loaded_info = False, float("inf"), None
        child.req_count = 0
        child._stdout_buf = b""
        child.last_used = child.last_heartbeat = child.t_spawn = time.monotonic()
        self._watch(child, proc)
        log.info("loading %s (pid %d)", child.name, proc.pid)
        self._notify("model_status", child.name, {"status": "loading"})

    def _popen(self, child: ChildServer, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=env, bufsize=0
        )

    def _watch(self, child: ChildServer, proc: subprocess.Popen) -> None:
        """The monitor reads the child's control lines from its stdout."""
        assert proc.stdout is not None  # stdout=PIPE
        os.set_blocking(proc.stdout.fileno(), False)
        self._sel.register(proc.stdout, selectors.EVENT_READ, child)

    def _stop_child(self, child: ChildServer) -> None:
        """unload(): a loading child is killed at once, a loaded one asked to exit."""
        proc = child.proc
        if child.status is ModelStatus.LOADING and proc is not None:
            log.info("%s is still loading: terminating it", child.name)
            proc.terminate()
            self._request_stop(child, send_exit=False)
        else:
            self._request_stop(child)

    def _request_stop(self, child: ChildServer, send_exit: bool = True) -> None:
        """Ask the child to exit; the monitor terminates it after its stop-timeout."""
        proc = child.proc  # once: the monitor thread may reap the child meanwhile
        if proc is None or child.stopping:
            return
        child.stopping = True
        child.stop_deadline = time.monotonic() + (
            child.spec.stop_timeout if child.spec else DEFAULT_STOP_TIMEOUT_S
        )
        if send_exit:
            assert proc.stdin is not None  # stdin=PIPE
            try:
                proc.stdin.write(b"exit\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass
        self._cv.notify_all()

    def _reap(self, child: ChildServer, timeout: float) -> None:
        proc = child.proc
        if proc is None:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._on_exit(child)

    def _on_exit(self, child: ChildServer) -> None:
        with self._cv:
            proc = child.proc
            if proc is None or proc.poll() is None:
                return
            assert proc.stdout is not None and proc.stdin is not None  # both pipes
            try:
                self._sel.unregister(proc.stdout)
            except (KeyError, ValueError):
                pass
            for f in (proc.stdout, proc.stdin):
                try:
                    f.close()
                except OSError:
                    pass
            if child.stopping:
                child.exit_code = 0  # we asked it to go; however it went, it did not fail
            else:
                child.exit_code = proc.returncode
                child.error = child.error or f"the child server exited with code {proc.returncode}"
                log.warning("model %s: %s", child.name, child.error)
            child.status = ModelStatus.UNLOADED
            child.proc, child.stopping, child.stop_deadline = None, False, float("inf")
            child.req_count, child.loaded_info = 0, None
            self._tick()
            self._cv.notify_all()
        data: dict[str, object] = {"status": "unloaded"}
        if child.failed:
            data.update(exit_code=child.exit_code, failed=True)
        self._notify("model_status", child.name, data)

    # -- monitor -------------------------------------------------------------------------------
    def _monitor_loop(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._sel.select(timeout=0.5) if self._sel.get_map() else []
            except (OSError, ValueError):
                events = []
            if not events:
                time.sleep(0.05 if self._sel.get_map() else 0.2)
            for key, _ in events:
                self._read_child(key.data)
            self._check_children()

    def _read_child(self, child: ChildServer) -> None:
        proc = child.proc  # once: another thread may reap the child meanwhile
        try:
            data = proc.stdout.read() if proc is not None and proc.stdout is not None else b""
        except (OSError, ValueError):
            data = b""
        if data is None:
            return
        if not data:  # EOF: the child is exiting
            if proc is not None:
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    return
            self._on_exit(child)
            return
        child._stdout_buf += data
        *lines, child._stdout_buf = child._stdout_buf.split(b"\n")
        for line in lines:
            self._on_message(child, line)

    def _on_message(self, child: ChildServer, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return  # not a control line
        if not isinstance(msg, dict):
            return
        child.last_heartbeat = time.monotonic()
        event = msg.get("event")
        if event == "listening":
            child.port = int(msg.get("port", 0))
        elif event == "failed":  # the load failed; the child exits next
            child.error = str(msg.get("error") or "")
        elif event == "ready" and child.status in (ModelStatus.LOADING, ModelStatus.SLEEPING):
            with self._cv:
                child.status = ModelStatus.LOADED
                self._cv.notify_all()
            log.info("model %s ready on port %d", child.name, child.port)
            self._notify("model_status", child.name, {"status": "loaded"})
        elif event == "sleeping" and child.status is ModelStatus.LOADED:
            with self._cv:
                child.status = ModelStatus.SLEEPING
                self._cv.notify_all()
            self._notify("model_status", child.name, {"status": "sleeping"})

    def _check_children(self) -> None:
        now = time.monotonic()
        with self._cv:
            # (child, process) pairs: a thread stopping a model may reap it and clear child.proc
            running = [(c, c.proc) for c in self.children.values() if c.proc is not None]
        for child, proc in running:
            if proc.poll() is not None:
                self._on_exit(child)
            elif child.stopping:
                if now > child.stop_deadline + 3:
                    proc.kill()
                elif now > child.stop_deadline:
                    proc.terminate()
            elif child.status is ModelStatus.LOADING and now - child.t_spawn > self.load_timeout_s:
                child.error = f"not ready after {self.load_timeout_s:.0f} s"
                proc.kill()
            elif child.status in SERVING and now - child.last_heartbeat > HEARTBEAT_TIMEOUT_S:
                child.error = f"no heartbeat for {HEARTBEAT_TIMEOUT_S:.0f} s"
                proc.kill()


def _changed(old: ModelSpec | None, new: ModelSpec) -> bool:
    """Whether a running child must restart to take `new` (its flags or names differ)."""
    return old is None or (old.options, old.aliases) != (new.options, new.aliases)


# -- child side --------------------------------------------------------------------------------


def _engine_command() -> list[str]:
    """How to run this engine's CLI in a child process: a PyInstaller bundle is its own CLI."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "engine"]


def start_child_monitor(on_exit_request) -> threading.Thread:
    """In a router's child: heartbeats on stdout; "exit" or EOF on stdin calls on_exit_request."""

    def beat():
        while True:
            time.sleep(HEARTBEAT_S)
            try:
                print(json.dumps({"event": "heartbeat"}), flush=True)
            except (BrokenPipeError, OSError, ValueError):
                on_exit_request()
                return

    def listen():
        for line in sys.stdin:
            if line.strip() == "exit":
                break
        on_exit_request()

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()
    t = threading.Thread(target=listen, name="router-control", daemon=True)
    t.start()
    return t
