"""Build the one-folder desktop bundle with PyInstaller and smoke-test it.

    python packaging/build.py [--model PATH] [--skip-smoke]

Steps: clean build/ and dist/, stamp the version, run PyInstaller on packaging/ggstation.spec,
then run the frozen binary's `gui --self-test` (offscreen) so a broken bundle fails the build.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as pkg_version

    try:
        return pkg_version("ggstation")
    except PackageNotFoundError:
        return "0.0.0+dev"


def build() -> Path:
    for d in (ROOT / "build", ROOT / "dist"):
        shutil.rmtree(d, ignore_errors=True)
    (ROOT / "packaging" / "VERSION").write_text(version() + "\n")
    subprocess.run([sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean",
                    str(ROOT / "packaging" / "ggstation.spec")], cwd=ROOT, check=True)
    return ROOT / "dist" / "ggstation" / ("ggstation.exe" if os.name == "nt" else "ggstation")


def smoke(binary: Path, model: str | None) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    cmd = [str(binary), "gui", "--self-test"] + (["-m", model] if model else [])
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    print(result.stdout.strip() or result.stderr.strip()[-2000:])
    if result.returncode != 0:
        sys.exit(f"self-test of the frozen app failed (exit {result.returncode})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF for the smoke test (default: a cached starter model)")
    parser.add_argument("--skip-smoke", action="store_true")
    args = parser.parse_args()
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        sys.exit("PyInstaller is not installed: python -m pip install pyinstaller")
    binary = build()
    print(f"built {binary}")
    if not args.skip_smoke:
        smoke(binary, args.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
