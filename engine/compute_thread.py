"""The compute thread: one long-lived thread runs every numba-parallel call of the engine.

Why: numba's OpenMP layer keeps one worker team per calling thread. With short spin-waits
(GOMP_SPINCOUNT, set in engine/__init__.py) a decode step's ~150 parallel regions start
without a futex wake-up each, which doubled decode speed here (SmolLM2 tg64 57 -> 117
tokens/s) -- but only while a single team exists: when the GUI's or the server's threads
each drove kernels, their teams spun against each other and decode fell below half. So every
caller hands its work to this thread and waits; the hand-off costs tens of microseconds.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

_lock = threading.Lock()
_thread: threading.Thread | None = None
_jobs: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()
_n_threads = 0  # numba threads for the jobs (0: numba's default)


def set_threads(n: int) -> None:
    global _n_threads
    _n_threads = int(n)


def _loop() -> None:
    import numba

    while True:
        fn, args, kwargs, done, box = _jobs.get()
        try:
            if _n_threads:
                numba.set_num_threads(_n_threads)
            box.append((True, fn(*args, **kwargs)))
        except BaseException as e:  # re-raised in the caller's thread
            box.append((False, e))
        finally:
            done.set()


def _ensure() -> threading.Thread:
    global _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_loop, name="ggstation-compute", daemon=True)
            _thread.start()
        return _thread


def run(fn: Callable[..., Any], *args, **kwargs) -> Any:
    """fn(*args, **kwargs) on the compute thread (directly when already there)."""
    t = _ensure()
    if threading.current_thread() is t:
        return fn(*args, **kwargs)
    done, box = threading.Event(), []
    _jobs.put((fn, args, kwargs, done, box))
    done.wait()
    ok, value = box[0]
    if ok:
        return value
    raise value
