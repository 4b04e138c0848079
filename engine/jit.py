"""The one place numba options live: decorator presets, cache location and thread count.

Every kernel in the engine is decorated with `kernel` or `parallel_kernel` (generated quant
kernels: with `generated_kernel`, which knows when their cache can be trusted) so that packaging
(PyInstaller, where numba's default cache locator fails) can change cache behaviour here.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numba

# NUMBA_CACHE_DIR for frozen bundles is set in engine/__init__.py, before numba is imported.

_OPTS: dict[str, Any] = dict(cache=True, fastmath=True, nogil=True, error_model="numpy")

kernel = numba.njit(**_OPTS)
parallel_kernel = numba.njit(parallel=True, **_OPTS)


def serial_and_parallel(fn: Callable[..., Any]) -> tuple[Any, Any]:
    """(kernel, parallel_kernel) of one body, each with its own cache entry.

    numba names a cache entry after the function's module, qualified name and line, and keys
    it by signature and target machine, not by its flags: the serial and the parallel kernel
    of one function would load each other's machine code, whichever was compiled first. A
    parallel region loaded into the serial kernel then ran where a thread wake-up costs more
    than the work, or crashed in a process whose OpenMP runtime was not started yet; the
    serial code in the parallel kernel ran long attention on one core. The parallel one is
    compiled from a copy of the function under another qualified name.
    """
    twin = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    twin.__qualname__ = fn.__qualname__ + "__parallel"
    twin.__module__, twin.__doc__ = fn.__module__, fn.__doc__
    return kernel(fn), parallel_kernel(twin)


# For kernels that must round exactly as C compiled without -ffast-math does (the sampler's
# float32 softmax, which has to match llama.cpp's bit for bit to pick the same tokens).
exact_kernel = numba.njit(**{**_OPTS, "fastmath": False})

# GGSTATION_PORTABLE_LUT=1: the 16-entry table lookups of IQ4_NL/IQ4_XS/MXFP4 use the portable
# select tree even where pshufb exists (engine/quants/_ir.py, Emit.lut16), and the int8 dots
# widening multiplies instead of AVX2's pmaddubsw (Emit.idot), to test and time
# the path non-x86 machines take. numba's cache does not know this choice, so the generated
# kernels then compile without it (generated_kernel).
PORTABLE_LUT = os.environ.get("GGSTATION_PORTABLE_LUT", "") not in ("", "0")

# The default decode path (engine/quants/__init__.py, default_decode_path): "x16" by default
# (integer dots over x in two 8-bit planes, ~15 bits: float-grade numbers at integer speed);
# GGSTATION_INT8=1 "int8", llama.cpp's (x rounded to 8 bits: its per-logit draw puts us no
# closer to llama.cpp's logits, docs/decode-paths.md); GGSTATION_NO_INT8=1 "float", the oracle
# (float32 x times the weights unpacked to float), which wins over GGSTATION_INT8.
DECODE_PATH = (
    "float"
    if os.environ.get("GGSTATION_NO_INT8", "") not in ("", "0")
    else "int8"
    if os.environ.get("GGSTATION_INT8", "") not in ("", "0")
    else "x16"
)
INT8 = DECODE_PATH == "int8"

_n_threads = 0  # set by set_num_threads (0: numba's default, every core)
_stale_warned = False  # generated_kernel's warning is given once per process
T = TypeVar("T")


def set_num_threads(n_threads: int) -> int:
    """Set the compute thread count (clamped to what numba was started with); returns it.

    numba's pool runs the decode kernels; engine.parallel's pool of as many Python threads runs
    the batch path with single-threaded BLAS (OpenBLAS's own threads are limited to one).
    """
    n_max = numba.config.NUMBA_NUM_THREADS
    n = max(1, min(int(n_threads) if n_threads and n_threads > 0 else n_max, n_max))
    global _n_threads
    _n_threads = n
    numba.set_num_threads(n)
    from . import parallel

    parallel.limit_blas_threads()
    parallel.set_pool_size(n)
    return n


def num_threads() -> int:
    """The compute thread count set_num_threads last set (0 before any)."""
    return _n_threads


_target_ready = False
_SCIPY_BLAS = "scipy.linalg.cython_blas"


def init_target() -> None:
    """Load numba's CPU target (its typing and lowering registries) without importing SciPy.

    The first compile in a process loads those registries (cache loads skip them:
    _load_cached_without_registries, which calls this on a cache miss); one of them
    (numba.np.arraymath) imports scipy.linalg, when SciPy is installed, only to decide whether
    np.convolve/np.correlate may call BLAS, which no engine kernel does. With SciPy 1.17 that
    import cost 0.13-0.25 s of CPU and ~20 MB of a generate's start-up (numpy.f2py and
    array_api_compat come with it). Here the target loads with that one import refused, which
    numba treats as "no SciPy" (a pure loop for those two functions); np.dot and np.linalg,
    were a kernel ever to use them, still import SciPy when they compile. Nothing is refused
    once SciPy's BLAS is already loaded, or once the target has loaded.
    """
    global _target_ready
    if _target_ready:
        return
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    with global_compiler_lock:  # the lock numba holds when a first call loads the target
        if _target_ready:
            return
        refuse = _SCIPY_BLAS not in sys.modules and "numba.np.arraymath" not in sys.modules
        if refuse:
            sys.modules[_SCIPY_BLAS] = None  # type: ignore[assignment]  # None: `import` raises ImportError
        try:
            cpu_target.target_context.refresh()
        finally:
            if refuse and sys.modules.get(_SCIPY_BLAS, 0) is None:
                del sys.modules[_SCIPY_BLAS]
        _target_ready = True


def _load_cached_without_registries() -> bool:
    """Let numba load cached kernels without first loading its CPU target's registries.

    numba's Cache.load_overload refreshes the target context (imports and installs every
    typing and lowering registry: 0.15 s of a warm start) before each cache load, yet
    rebuilding a cached kernel needs none of them, only numba's runtime (NRT, whose allocator
    the kernels call), which is started here as the refresh would. Compiling does need them,
    and numba's compiler refreshes the context itself (CompilerBase); a cache miss here loads
    them first, through init_target, so SciPy stays out as before. Returns False, leaving
    numba as it is, when its Cache does not have the shape this was written against (numba
    0.60-0.68).
    """
    from numba.core import caching

    cls = caching.Cache
    if getattr(cls.load_overload, "_ggstation", False):
        return True
    if not all(hasattr(cls, a) for a in ("_load_overload", "_guard_against_spurious_io_errors")):
        return False

    from numba.core.runtime import rtsys

    def load_overload(self, sig, target_context):  # numba's signature
        rtsys.initialize(target_context)  # the part of a refresh cached code needs (NRT); once
        data = None
        with self._guard_against_spurious_io_errors():
            data = self._load_overload(sig, target_context)
        if data is None:  # numba compiles next: load the registries, without SciPy
            init_target()
        return data

    load_overload._ggstation = True  # type: ignore[attr-defined]
    cls.load_overload = load_overload  # type: ignore[method-assign]
    return True


LAZY_REGISTRIES = _load_cached_without_registries()


def on_passing_thread(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on a thread that exits when fn returns; fn's exception is re-raised here.

    For parallel kernels run outside the thread that owns a context (the warm-up at load).
    libgomp keeps an OpenMP team per thread that ever launched a parallel region, for that
    thread's lifetime; while two teams exist it throttles every team's spin-wait (more
    managed threads than cores), so each of a decode step's ~150 regions pays a futex wake-up:
    SmolLM2 decode fell from 92 to 64 tokens/s when the loading thread stayed alive. A team
    ends with its thread.
    """
    box: list[tuple[bool, Any]] = []

    def target() -> None:
        use_num_threads()
        try:
            box.append((True, fn(*args)))
        except BaseException as e:  # re-raised in the caller's thread
            box.append((False, e))

    t = threading.Thread(target=target, name="ggstation-warmup")
    t.start()
    t.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def use_num_threads() -> None:
    """Apply the configured thread count on the calling thread.

    numba's thread count is per calling thread, and whichever thread calls Context.decode
    launches the kernels itself (the scheduler's thread, the CLI's main thread).
    """
    if _n_threads:
        numba.set_num_threads(_n_threads)


# --- generated kernel modules ------------------------------------------------------------------
# numba re-uses a cached kernel while the *decorated function's own file* is unchanged (its stamp
# is a hash of that file's bytes). The quant kernels are generated modules
# (engine/quants/generated/, written by engine/quants/codegen.py) whose machine code also comes
# from other files: the LLVM IR emitters in _ir.py and the per-type Layout that drives them,
# and the helper kernels in _kern.py that numba links in (a caller's cache entry keeps the
# callee's code it was built with, numba/numba#6845). So each generated module embeds a digest
# of those sources. Regenerating after an edit changes the digest, hence the generated file, and
# numba's own stamp check recompiles: nothing is ever deleted from the cache. Edited but not
# regenerated, the embedded digest no longer matches: generated_kernel() then warns and compiles
# that module's kernels uncached, so stale machine code is never run.


def source_digest(paths) -> str:
    """Digest (16 hex digits) of the text of `paths`, in order, line endings normalised (a
    checkout with CRLF line endings gives the same digest)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(hashlib.sha256(Path(p).read_bytes().replace(b"\r\n", b"\n")).digest())
    return h.hexdigest()[:16]


def generated_kernel(module_file: str, sources, digest: str, parallel: bool = True):
    """The decorator for the kernels of a generated module: `parallel_kernel` (or `kernel`)
    when `digest` matches the current `sources`, an uncached variant (with a warning) when not;
    uncached too (no warning) under GGSTATION_PORTABLE_LUT.

    Args:
        module_file: the generated module's __file__ (for the message).
        sources: the modules whose code is compiled into its kernels besides its own.
        digest: source_digest() of their files when the module was generated.
    Returns:
        A numba.njit decorator with the engine's options.
    """
    try:
        current = source_digest(m.__file__ for m in sources)
    except (OSError, TypeError):  # no sources beside the code (frozen bundle): nothing can drift
        current = digest
    uncached = numba.njit(parallel=parallel, **{**_OPTS, "cache": False})
    if current == digest:
        # PORTABLE_LUT: right sources, but machine code the cache must not mix with the usual
        return uncached if PORTABLE_LUT else (parallel_kernel if parallel else kernel)
    global _stale_warned
    if not _stale_warned:  # once: after an edit to _ir.py every generated module is stale
        _stale_warned = True
        warnings.warn(
            f"{module_file} is older than {', '.join(m.__name__ for m in sources)}: generated "
            "kernels older than their sources compile without numba's cache until you run "
            "`python -m engine.quants.codegen`",
            RuntimeWarning,
            stacklevel=2,
        )
    return uncached
