"""The one place numba options live: decorator presets, cache location and thread count.

Every kernel in the engine is decorated with `kernel` or `parallel_kernel` so that packaging
(PyInstaller, where numba's default cache locator fails) can change cache behaviour here.
"""

from __future__ import annotations

import numba

# NUMBA_CACHE_DIR for frozen bundles is set in engine/__init__.py, before numba is imported.

_OPTS = dict(cache=True, fastmath=True, nogil=True, error_model="numpy")

kernel = numba.njit(**_OPTS)
parallel_kernel = numba.njit(parallel=True, **_OPTS)


def set_num_threads(n_threads: int) -> int:
    """Set the compute thread count (clamped to what numba was started with); returns it.

    numba's pool runs the decode kernels; engine.parallel's pool of as many Python threads runs
    the batch path with single-threaded BLAS (OpenBLAS's own threads are limited to one).
    """
    n_max = numba.config.NUMBA_NUM_THREADS
    n = max(1, min(int(n_threads) if n_threads and n_threads > 0 else n_max, n_max))
    numba.set_num_threads(n)
    from . import compute_thread, parallel

    compute_thread.set_threads(n)
    parallel.limit_blas_threads()
    parallel.set_pool_size(n)
    return n


def get_num_threads() -> int:
    return numba.get_num_threads()
