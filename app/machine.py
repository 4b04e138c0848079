"""Facts about this machine and process: CPU, RAM, RSS, free ports, file hashes.

Qt-free and engine-free, so the real adapter and the test fake report the same machine.
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from .dto import BackendInfo

_SIMD_OF_INTEREST = (
    "sse4.2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512vnni",
    "avx512bf16",
    "avxvnni",
    "amx-int8",
    "neon",
    "sve",
    "dotprod",
)


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def backend_info(n_threads: int = 0) -> BackendInfo:
    """The CPU the numba engine compiles for, with the SIMD features that matter to its kernels."""
    try:
        import llvmlite.binding as llvm

        features = llvm.get_host_cpu_features()
        simd = tuple(f for f in _SIMD_OF_INTEREST if features.get(f, False))
        target = llvm.get_host_cpu_name()
    except Exception:  # llvmlite missing or too old: say so instead of guessing
        simd, target = (), "unknown"
    n_logical = psutil.cpu_count(logical=True) or 1
    return BackendInfo(
        cpu_model=cpu_model_name(),
        n_cores=psutil.cpu_count(logical=False) or n_logical,
        n_logical=n_logical,
        n_threads=n_threads or n_logical,
        cpu_target=target,
        simd=simd,
    )


def available_ram() -> int:
    return psutil.virtual_memory().available


def process_rss() -> int:
    return psutil.Process().memory_info().rss


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host if host != "0.0.0.0" else "", 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def file_sha256(path: str, progress: Callable[[float, str], None] | None = None) -> str:
    h, size, done = hashlib.sha256(), max(os.path.getsize(path), 1), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(done / size, "hashing the file (sha256, for the replay record)")
    return h.hexdigest()


def now_ms() -> float:
    return time.perf_counter() * 1000.0
