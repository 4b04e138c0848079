"""ggstation's one version, and the facts a bug report needs (`ggstation --version`).

`__version__` comes from the installed package's metadata, i.e. pyproject.toml's `version`; the
PyInstaller bundle carries that metadata (packaging/ggstation.spec copies it). Whatever shows a
version (the CLI, the server's OpenAPI document, the app's About) reads it from here.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

DIST_NAME = "ggstation"
# The SIMD features the kernels care about, in the order they are shown.
_SIMD = ("neon", "avx2", "fma", "avx512f", "avx512bw", "avx512vnni", "avxvnni")
# Written by packaging/ggstation.spec into the bundle: the commit it was built from.
COMMIT_FILE = "ggstation-commit.txt"
_ROOT = Path(__file__).resolve().parent.parent


def _package_version() -> str:
    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        pass
    # A checkout run without `pip install` (PYTHONPATH=.): read pyproject.toml itself.
    try:
        text = (_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return "0+unknown"
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    return m.group(1) if m else "0+unknown"


__version__ = _package_version()


def git_commit() -> str | None:
    """The short commit the code runs from: stamped into a bundle, or read from a checkout's .git.

    Reads files only (no `git` subprocess), so it costs nothing and never hangs; anything
    unexpected (a worktree's `.git` file, a detached packed ref it cannot find) gives None.
    """
    if getattr(sys, "frozen", False):
        try:
            return (Path(getattr(sys, "_MEIPASS", "")) / COMMIT_FILE).read_text().strip() or None
        except OSError:
            return None
    git = _ROOT / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:7] or None
        ref = head[5:]
        ref_file = git / ref
        if ref_file.is_file():
            return ref_file.read_text().strip()[:7] or None
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line[:7]
    except OSError:
        pass
    return None


def build_info() -> str:
    """llama-server's build string, `b<build>-<commit>` (its /props `build_info` and the OpenAI
    `system_fingerprint`), from ggstation's version and commit."""
    return f"b{__version__}-{git_commit() or 'unknown'}"


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:  # a bundle that left out the metadata: ask the module
        try:
            return str(__import__(name).__version__)
        except Exception:
            return "?"


def cpu_target() -> str:
    """The CPU numba compiles for (NUMBA_CPU_NAME or the host's) and its SIMD features of interest."""
    try:
        import llvmlite.binding as llvm

        name = os.environ.get("NUMBA_CPU_NAME") or llvm.get_host_cpu_name()
        features = llvm.get_host_cpu_features()
        simd = [f for f in _SIMD if features.get(f, False)]
    except Exception as e:  # llvmlite missing or broken: say so, --version must not fail
        return f"unknown ({type(e).__name__})"
    return f"{name} ({' '.join(simd) or 'no SIMD of interest'})"


def version_text() -> str:
    """Two lines for `ggstation --version` and bug reports.

    ggstation 0.1.0 (git 0adf0c4)
    Python 3.11.7, numba 0.68.1, llvmlite 0.50.0, numpy 2.4.6; CPU emeraldrapids (avx2 fma ...); Linux x86_64
    """
    commit = git_commit()
    first = f"{DIST_NAME} {__version__}" + (f" (git {commit})" if commit else "")
    if getattr(sys, "frozen", False):
        first += " [bundle]"
    libs = ", ".join(f"{name} {_dist_version(name)}" for name in ("numba", "llvmlite", "numpy"))
    second = (
        f"Python {platform.python_version()}, {libs}; CPU {cpu_target()}, {os.cpu_count()} threads; "
        f"{platform.system()} {platform.machine()}"
    )
    return f"{first}\n{second}"
