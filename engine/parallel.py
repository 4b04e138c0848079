"""The batch-path worker pool: n_threads Python threads, each running single-threaded BLAS and
single-threaded numba kernels (both release the GIL) on its own share of a matmul.

Why not let OpenBLAS and numba thread themselves: their pools spin-wait for work and fight over
the same cores; with any other process busy, OpenBLAS's 2-thread GEMM fell from ~350 to ~86
tokens/s here. Threads that block instead of spin make prefill steady.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numba

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_size = 1


class _PoolThread(threading.local):
    active = False  # this thread is one of the pool's workers


_in_pool = _PoolThread()


def _init_worker() -> None:
    numba.set_num_threads(1)
    _in_pool.active = True


def limit_blas_threads() -> None:
    """One BLAS thread per caller: our pool provides the parallelism (see module doc)."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1, user_api="blas")
    except Exception:  # threadpoolctl missing or BLAS unknown: keep the library's default
        pass


def set_pool_size(n: int) -> None:
    global _pool, _size
    n = max(1, int(n))
    with _lock:
        if n == _size and (_pool is not None or n == 1):
            return
        if _pool is not None:
            _pool.shutdown(wait=False)
        _pool = (
            ThreadPoolExecutor(n, thread_name_prefix="ggstation-blas", initializer=_init_worker)
            if n > 1
            else None
        )
        _size = n


def pool_size() -> int:
    return _size


def run_parts(fn: Callable[[int, int], None], n_parts: int) -> None:
    """Call fn(part, worker) for part in range(n_parts), spread over the pool; re-raises.
    Called from one of the pool's own threads (a part that runs parts), it runs them there:
    waiting on the pool from inside it could leave every worker waiting on the others."""
    pool = _pool
    if pool is None or n_parts <= 1 or _in_pool.active:
        for p in range(n_parts):
            fn(p, 0)
        return
    n = min(_size, n_parts)
    futures = [pool.submit(_stripe, fn, w, n, n_parts) for w in range(n)]
    for f in futures:
        f.result()


def _stripe(fn, worker: int, n_workers: int, n_parts: int) -> None:
    for p in range(worker, n_parts, n_workers):
        fn(p, worker)


def split(n: int, parts: int) -> Sequence[tuple[int, int]]:
    """[(start, stop)] cutting range(n) into `parts` nearly equal pieces."""
    q, r = divmod(n, parts)
    out, s = [], 0
    for i in range(parts):
        e = s + q + (i < r)
        out.append((s, e))
        s = e
    return out
