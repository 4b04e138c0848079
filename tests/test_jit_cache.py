"""numba's on-disk kernel cache: each compiled variant has its own entry, and kernels loaded
from it run as a process's first kernel."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine import jit, ops

ROOT = Path(__file__).resolve().parent.parent


def _index_path(dispatcher) -> str:
    return dispatcher._cache._cache_file._index_path


@pytest.mark.filterwarnings(
    "ignore::numba.NumbaPerformanceWarning"
)  # `body` has nothing to parallelise
def test_serial_and_parallel_kernels_have_their_own_cache_entries():
    # numba keys a cache entry by the function's name and signature, not its flags: one entry
    # for both made the parallel attention kernel load the serial one's machine code
    assert _index_path(ops._attn_s) != _index_path(ops._attn_p)

    def body(x):
        return x + 1

    s, p = jit.serial_and_parallel(body)
    assert _index_path(s) != _index_path(p)
    assert s(1) == p(1) == 2


_SCRIPT = textwrap.dedent("""
    import numpy as np
    from engine import ops
    rng = np.random.default_rng(0)
    H, G, D, C = 4, 2, 32, 4096
    k = rng.standard_normal((1, C, G, D)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((1, C, G, D)).astype(np.float16).view(np.uint16)
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    seq = np.zeros(1, np.int32)
    for depth in (8, C - 1):  # the serial kernel, then the parallel one
        out = np.empty((1, H, D), np.float32)
        ops.attention_tokens(q, k, v, seq, np.array([depth], np.int32), 0, 0.2, 0.0, out)
        print(depth, float(np.abs(out).sum()))
    print(sum(ops._attn_s.stats.cache_hits.values()), sum(ops._attn_p.stats.cache_hits.values()))
""")


def test_attention_loaded_from_cache_runs_as_first_kernel(tmp_path):
    # get_thread_id() in a kernel loaded from the cache needs the threading layer started,
    # which only compiling did: the second process crashed (SIGSEGV) here
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    runs = [
        subprocess.run(
            [sys.executable, "-c", _SCRIPT],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        for _ in range(2)
    ]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    first, second = (r.stdout.splitlines() for r in runs)
    assert first[:2] == second[:2]  # same results from the cached machine code
    assert first[2] == "0 0" and second[2] == "1 1", (
        "each kernel loads its own entry the second time"
    )
