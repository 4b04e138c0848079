"""The version line, the bundle's spec and build script (fast), and the bundle build itself (`-m package`)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import main
from engine.version import __version__, git_commit

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "packaging" / "ggstation.spec"
BUILD = ROOT / "packaging" / "build.py"
# Loaded when engine/ and app/ are imported but optional for them: the importer catches the
# ImportError, so the bundle leaves them out. Each with the importer that tries it.
OPTIONAL_AT_RUN_TIME = {
    "scipy": "numba/__init__.py checks scipy's version if scipy is installed",
    "trio": "httpcore's and httpcore2's _synchronization, for callers on trio (ours run on asyncio)",
    "watchfiles": "uvicorn.supervisors picks it for --reload when installed (ray[serve] brings it), "
    "else falls back to its stat reloader; we never reload",
}
# Extras the spec excludes on purpose: engine/ imports them only in the code paths that need
# them, and tells the user to install the extra when they are missing.
NOT_BUNDLED = {"ray": "serve --ray (engine/cluster), the cluster extra"}


def spec_excludes() -> list[str]:
    """The EXCLUDES list of packaging/ggstation.spec, read without running PyInstaller."""
    for node in ast.parse(SPEC.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "EXCLUDES" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError("packaging/ggstation.spec has no EXCLUDES = [...]")


def excluded_by(module: str, excludes: list[str]) -> str | None:
    return next((e for e in excludes if module == e or module.startswith(e + ".")), None)


def source_imports() -> dict[tuple[str, str | None], str]:
    """Every absolute import in engine/ and app/, module-level or in a function, as (module, name)
    (`from m import n`; name None for `import m`) -> one file that has it."""
    found: dict[tuple[str, str | None], str] = {}
    for path in sorted([*(ROOT / "engine").rglob("*.py"), *(ROOT / "app").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            pairs: list[tuple[str, str | None]] = []
            if isinstance(node, ast.Import):
                pairs = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                pairs = [(node.module, a.name) for a in node.names]
            for pair in pairs:
                found.setdefault(pair, str(path.relative_to(ROOT)))
    return found


# Imports, in a fresh interpreter, every module of engine/ and app/ and everything their sources
# import, lazily or not (`from huggingface_hub import HfApi` loads huggingface_hub.hf_api, which
# imports tqdm); prints the modules that loaded. A third-party import that fails is skipped: the
# code that has it treats the package as optional.
_IMPORT_ALL = """
import importlib, json, pkgutil, sys
pairs = json.loads(sys.stdin.read())
before = set(sys.modules)  # less what the interpreter loaded (site's .pth hooks: _distutils_hack)
import engine, app
for pkg in (engine, app):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
for module, name in pairs:
    try:
        mod = importlib.import_module(module)
        if name and name != "*" and not hasattr(mod, name):  # then a submodule: `from PySide6 import QtCore`
            importlib.import_module(module + "." + name)
        elif name and name != "*":
            getattr(mod, name)  # a lazy attribute loads its module now
    except ImportError:
        if module.split(".")[0] in ("engine", "app"):
            raise
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def pyproject_version() -> str:
    m = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert m, "pyproject.toml has no version"
    return m.group(1)


def test_version_flag_prints_version_and_bug_report_facts(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])  # not routed to `gui`, as other leading options are
    assert exit_info.value.code == 0
    first, second = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"ggstation \d+\.\d+\.\d+\S*( \(git [0-9a-f]{7}\))?", first), first
    assert first.split()[1] == __version__ == pyproject_version()
    for fact in (
        f"Python {sys.version_info.major}.{sys.version_info.minor}.",
        "numba ",
        "llvmlite ",
        "numpy ",
        "CPU ",
    ):
        assert fact in second, second
    assert "unknown" not in second.split("CPU ")[1], second  # llvmlite answered for the host CPU


def test_python_m_engine_version():
    out = subprocess.run(
        [sys.executable, "-m", "engine", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"ggstation {__version__}")


def test_git_commit_is_the_checkouts_head():
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").is_dir():
        pytest.skip("not a git checkout")
    head = subprocess.run(
        [git, "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    assert git_commit() == head.stdout.strip()


def test_spec_excludes_nothing_engine_or_app_imports():
    excludes = spec_excludes()
    assert "scipy" in excludes and "PySide6.QtNetwork" in excludes  # the list was read, not empty
    hits = {}
    for (module, name), where in source_imports().items():
        if module.split(".")[0] in NOT_BUNDLED:
            continue
        for candidate in (
            module,
            f"{module}.{name}",
        ):  # `from PySide6 import QtNetwork` is a module
            if excluded_by(candidate, excludes):
                hits[candidate] = (where, excluded_by(candidate, excludes))
    assert hits == {}


def test_spec_excludes_nothing_loaded_when_engine_and_app_import():
    pairs = sorted(
        (p for p in source_imports() if p[0].split(".")[0] not in NOT_BUNDLED),
        key=lambda p: (p[0], p[1] or ""),
    )
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL],
        input=json.dumps(pairs),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    excludes = spec_excludes()
    loaded = {m: excluded_by(m, excludes) for m in json.loads(out.stdout.splitlines()[-1])}
    unexpected = {m: e for m, e in loaded.items() if e and e not in OPTIONAL_AT_RUN_TIME}
    assert unexpected == {}


def test_build_script_help_and_dry_run(tmp_path):
    assert (
        subprocess.run(
            [sys.executable, str(BUILD), "--help"], capture_output=True, timeout=60
        ).returncode
        == 0
    )
    out = subprocess.run(
        [sys.executable, str(BUILD), "--dry-run", "--model", "m.gguf", "--dist", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    pyinstaller, *smoke = out.stdout.strip().splitlines()
    assert (
        "-m PyInstaller" in pyinstaller
        and str(SPEC) in pyinstaller
        and str(tmp_path) in pyinstaller
    )
    exe = str(tmp_path / "ggstation" / "ggstation")
    assert [line.removeprefix(exe).split()[:2] for line in smoke] == [
        ["--version"],
        ["info", "-m"],
        ["generate", "-m"],
        ["gui", "--self-test"],
    ]


@pytest.mark.package
def test_bundle_builds_and_passes_its_smoke_test(tmp_path):
    """Minutes: PyInstaller, then the bundle's --version, info, generate and GUI self-test (build.py)."""
    pytest.importorskip(
        "PyInstaller", reason='needs the package extra: pip install -e ".[package]"'
    )
    out = subprocess.run(
        [
            sys.executable,
            str(BUILD),
            "--dist",
            str(tmp_path / "dist"),
            "--work",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    assert f"ggstation {__version__}" in out.stdout
