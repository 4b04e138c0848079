"""Build the one-folder ggstation bundle with PyInstaller, smoke-test it and list what is in it.

    python -m pip install -e ".[package]"
    python packaging/build.py [--model PATH|NAME] [--skip-smoke] [--dist DIR] [--work DIR] [--dry-run]

Steps: run PyInstaller on packaging/ggstation.spec into DIST/ggstation (build files in WORK), then
run the frozen executable: `--version`, and with a model (default: the cached smollm2 starter
model) `info`, `generate -n 4` and `gui --self-test` offscreen, so a broken bundle fails the build.
Last, print the bundle's size and its largest parts.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "packaging" / "ggstation.spec"
EXE_NAME = "ggstation.exe" if os.name == "nt" else "ggstation"
SMOKE_TIMEOUT_S = 900  # the first run compiles the numba kernels (a minute or two)


def pyinstaller_cmd(dist: Path, work: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "PyInstaller",
        "--noconfirm",
        "--clean",
        "--distpath",
        str(dist),
        "--workpath",
        str(work),
        str(SPEC),
    ]


def default_model() -> str | None:
    """The cached smollm2 starter model, if this checkout's environment has pulled it."""
    try:
        from engine.hub.store import cached_path

        path = cached_path("smollm2")
    except Exception:
        return None
    return str(path) if path else None


def smoke_cmds(exe: Path, model: str | None) -> list[list[str]]:
    cmds = [[str(exe), "--version"]]
    if model:
        cmds += [
            [str(exe), "info", "-m", model],
            [str(exe), "generate", "-m", model, "-p", "hi", "-n", "4", "--temp", "0"],
            [str(exe), "gui", "--self-test", "-m", model],
        ]
    return cmds


def smoke(exe: Path, model: str | None) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    for cmd in smoke_cmds(exe, model):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S)
        print(f"$ {shlex.join(cmd[1:])}  [{time.perf_counter() - t0:.1f} s, exit {r.returncode}]")
        print(_indent(r.stdout.strip() or r.stderr.strip(), 1500))
        if r.returncode != 0:
            sys.exit(
                f"smoke test of the bundle failed: {shlex.join(cmd)}\n{_indent(r.stderr.strip(), 3000)}"
            )
    if not model:
        print(
            "no model for info/generate/self-test: pull one (ggstation models pull smollm2) or pass --model"
        )


def _indent(text: str, limit: int) -> str:
    text = text if len(text) <= limit else "..." + text[-limit:]
    return "\n".join("    " + line for line in text.splitlines())


def tree_size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() or f.is_symlink())


def size_report(bundle: Path, top: int = 15) -> str:
    """Total size and the largest entries, one level below _internal/ (packages, libraries)."""
    internal = bundle / "_internal"
    parts = [p for p in bundle.iterdir() if p != internal]
    parts += list(internal.iterdir()) if internal.is_dir() else []
    sizes = sorted(
        ((tree_size(p), p.relative_to(bundle)) for p in parts), key=lambda t: t[0], reverse=True
    )
    lines = [f"{bundle}: {tree_size(bundle) / 2**20:.0f} MiB"]
    lines += [f"  {n / 2**20:7.1f} MiB  {p.as_posix()}" for n, p in sizes[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    parser.add_argument(
        "--model",
        help="GGUF path or starter-model name for the smoke test "
        "(default: the cached smollm2 starter model; none: --version only)",
    )
    parser.add_argument("--skip-smoke", action="store_true", help="build only, run nothing")
    parser.add_argument(
        "--dist", type=Path, default=ROOT / "dist", help="output folder (default: dist/)"
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=ROOT / "build" / "pyinstaller",
        help="PyInstaller's build files (default: build/pyinstaller/)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)

    exe = args.dist / "ggstation" / EXE_NAME
    model = args.model or default_model()
    if args.dry_run:
        print(shlex.join(pyinstaller_cmd(args.dist, args.work)))
        for cmd in [] if args.skip_smoke else smoke_cmds(exe, model):
            print(shlex.join(cmd))
        return 0
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        sys.exit('PyInstaller is not installed: python -m pip install -e ".[package]"')
    subprocess.run(pyinstaller_cmd(args.dist, args.work), cwd=ROOT, check=True)
    print(f"built {exe}")
    if not args.skip_smoke:
        smoke(exe, model)
    print(size_report(exe.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
