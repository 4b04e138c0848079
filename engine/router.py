"""Router mode: `ggstation serve` without -m supervises one child server per model.

Each model has a status; the router is a process supervisor with this state machine
(after llama.cpp's server-models.h):

    UNLOADED --load()--> LOADING --child prints {"event": "ready"}--> LOADED
    LOADING  --child exits or load timeout--> FAILED (exit_code kept)
    LOADED   --unload() / LRU eviction--> UNLOADED
    LOADED   --child exits or stops sending heartbeats--> FAILED (exit_code kept)
    FAILED   --load()--> LOADING

A child is `python -m engine serve -m PATH --host 127.0.0.1 --port 0 --ready-json` with a
random internal API key. It reports start-up milestones and heartbeats as JSON lines on
stdout; the router stops it with an "exit" line on stdin (terminate after a timeout), and a
child whose stdin closes (the router died) exits by itself. One monitor thread reads every
child's stdout and notices crashes. When more than `models_max` models would be loaded the
least recently used LOADED one is unloaded. Proxying is plain HTTP (engine/server/proxy.py).
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
from dataclasses import dataclass, field
from pathlib import Path

from .errors import RouterError, UnknownModelError

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
HEARTBEAT_TIMEOUT_S = 60.0  # generous: a child compiling kernels may hold the GIL a while
STOP_TIMEOUT_S = 5.0


class ModelStatus(enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


@dataclass
class ChildServer:
    """One model and, while it runs, its child process."""

    name: str
    path: Path
    status: ModelStatus = ModelStatus.UNLOADED
    proc: subprocess.Popen | None = None
    port: int = 0
    api_key: str = ""
    last_used: float = 0.0
    last_heartbeat: float = 0.0
    exit_code: int | None = None
    error: str = ""
    ready: threading.Event = field(default_factory=threading.Event)
    t_spawn: float = 0.0
    stopping: bool = False
    _stdout_buf: bytes = b""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def info(self) -> dict:
        d: dict[str, object] = {"value": self.status.value}
        if self.status is ModelStatus.FAILED:
            d.update(failed=True, exit_code=self.exit_code, error=self.error)
        return d


def discover_models(directory: Path) -> dict[str, Path]:
    """name (file name without .gguf) -> path, for every .gguf in `directory`."""
    if not directory.is_dir():
        return {}
    return {p.name[: -len(".gguf")]: p for p in sorted(directory.glob("*.gguf")) if p.is_file()}



def discover_hub_models() -> dict[str, Path]:
    """The Hugging Face cache's complete GGUF models, named as llama-server names them
    ("user/repo:Q4_K_M", engine/hub.py cached_models)."""
    try:
        from .hub import cached_models
    except ImportError:  # huggingface_hub missing: no cache to list
        return {}
    out: dict[str, Path] = {}
    for f in cached_models():
        if f.local_path is not None:
            out.setdefault(f.spec, f.local_path)
    return out


class Router:
    """Starts, watches and stops child servers.

    Args:
        models: model name -> GGUF path.
        child_args: extra `ggstation serve` flags for every child (-c, -np, sampling...).
        models_max: most models loaded at once (0 = unlimited); LRU eviction beyond.
        load_timeout_s: a child not ready by then is stopped and marked FAILED.
    """

    def __init__(self, models: dict[str, Path], child_args: list[str] | None = None, *,
                 models_max: int = 4, autoload: bool = True, load_timeout_s: float = 600.0):
        self.children = {name: ChildServer(name, Path(path)) for name, path in models.items()}
        self.child_args = list(child_args or [])
        self.models_max = models_max
        self.autoload = autoload
        self.load_timeout_s = load_timeout_s
        self._lock = threading.RLock()
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._monitor_loop, name="router-monitor", daemon=True)

    # -- public API ------------------------------------------------------------------
    def start(self) -> Router:
        self._monitor.start()
        return self

    def stop(self) -> None:
        """Stop every child (graceful "exit" line, then terminate) and the monitor."""
        with self._lock:
            running = [c for c in self.children.values() if c.proc is not None]
        for child in running:
            self._stop_child(child, wait=False)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in running:
            self._reap(child, max(0.1, deadline - time.monotonic()))
        self._stop.set()

    def get(self, name: str) -> ChildServer:
        child = self.children.get(name)
        if child is None:
            for c in self.children.values():  # also accept the file name with .gguf
                if c.path.name == name:
                    return c
            known = ", ".join(sorted(self.children)) or "none"
            raise UnknownModelError(f"model '{name}' not found (available: {known})")
        return child

    def load(self, name: str) -> ChildServer:
        """Start the child for `name` unless it is LOADING or LOADED; returns at once."""
        with self._lock:
            child = self.get(name)
            if child.status in (ModelStatus.LOADING, ModelStatus.LOADED):
                return child
            self._evict_for_one_more()
            self._spawn(child)
            return child

    def unload(self, name: str) -> None:
        with self._lock:
            child = self.get(name)
            if child.proc is None:
                raise RouterError(f"model '{name}' is not loaded")
            self._stop_child(child, wait=False)
        self._reap(child, STOP_TIMEOUT_S)

    def ensure_ready(self, name: str, timeout: float | None = None) -> ChildServer:
        """The LOADED child for `name`, loading it first when autoload is on.

        Raises:
            UnknownModelError, RouterError (not loaded and autoload off, failed, timeout).
        """
        child = self.get(name)
        if child.status is not ModelStatus.LOADED:
            if not self.autoload and child.status is not ModelStatus.LOADING:
                raise RouterError(f"model '{name}' is not loaded (POST /models/load first)")
            child = self.load(name)
        if not child.ready.wait(self.load_timeout_s if timeout is None else timeout):
            raise RouterError(f"model '{name}' did not become ready in time")
        if child.status is not ModelStatus.LOADED:
            raise RouterError(f"model '{name}' failed to load: {child.error or 'exit code ' + str(child.exit_code)}")
        child.last_used = time.monotonic()
        return child

    def models_info(self) -> list[dict]:
        with self._lock:
            return [{"id": c.name, "path": str(c.path), "status": c.info()} for c in self.children.values()]

    # -- children ----------------------------------------------------------------------
    def _evict_for_one_more(self) -> None:
        if self.models_max <= 0:
            return
        active = [c for c in self.children.values() if c.status in (ModelStatus.LOADING, ModelStatus.LOADED)]
        while len(active) >= self.models_max:
            loaded = [c for c in active if c.status is ModelStatus.LOADED]
            if not loaded:
                raise RouterError(f"{len(active)} models are loading; the limit is {self.models_max}")
            victim = min(loaded, key=lambda c: c.last_used)
            log.info("unloading %s (least recently used)", victim.name)
            self._stop_child(victim, wait=False)
            active.remove(victim)

    def _spawn(self, child: ChildServer) -> None:
        child.api_key = secrets.token_urlsafe(24)
        cmd = [*_engine_command(), "serve", "-m", str(child.path), "--host", "127.0.0.1",
               "--port", "0", "--ready-json", "--alias", child.name, *self.child_args]
        env = dict(os.environ, LLAMA_API_KEY=child.api_key)
        child.proc = proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
                                             env=env, bufsize=0)
        child.status, child.exit_code, child.error, child.port = ModelStatus.LOADING, None, "", 0
        child.ready.clear()
        child.stopping = False
        child._stdout_buf = b""
        child.last_used = child.last_heartbeat = time.monotonic()
        child.t_spawn = time.monotonic()
        assert proc.stdout is not None  # stdout=PIPE
        os.set_blocking(proc.stdout.fileno(), False)
        self._sel.register(proc.stdout, selectors.EVENT_READ, child)
        log.info("loading %s (pid %d)", child.name, proc.pid)

    def _stop_child(self, child: ChildServer, wait: bool) -> None:
        proc = child.proc  # once: the monitor thread may reap the child meanwhile
        if proc is None:
            return
        child.stopping = True
        assert proc.stdin is not None  # stdin=PIPE
        try:
            proc.stdin.write(b"exit\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass
        if wait:
            self._reap(child, STOP_TIMEOUT_S)

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
        with self._lock:
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
            child.exit_code = proc.returncode
            if child.stopping:
                child.status = ModelStatus.UNLOADED
            else:
                child.status = ModelStatus.FAILED
                child.error = child.error or f"the child server exited with code {proc.returncode}"
                log.warning("model %s: %s", child.name, child.error)
            child.proc = None
            child.ready.set()  # wake waiters; they check the status

    # -- monitor -------------------------------------------------------------------------
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
        elif event == "ready" and child.status is ModelStatus.LOADING:
            child.status = ModelStatus.LOADED
            child.ready.set()
            log.info("model %s ready on port %d", child.name, child.port)

    def _check_children(self) -> None:
        now = time.monotonic()
        with self._lock:
            # (child, process) pairs: a thread stopping a model may reap it and clear child.proc
            running = [(c, c.proc) for c in self.children.values() if c.proc is not None]
        for child, proc in running:
            if proc.poll() is not None:
                self._on_exit(child)
            elif child.stopping:
                continue
            elif child.status is ModelStatus.LOADING and now - child.t_spawn > self.load_timeout_s:
                child.error = f"not ready after {self.load_timeout_s:.0f} s"
                proc.kill()
            elif child.status is ModelStatus.LOADED and now - child.last_heartbeat > HEARTBEAT_TIMEOUT_S:
                child.error = f"no heartbeat for {HEARTBEAT_TIMEOUT_S:.0f} s"
                proc.kill()


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
