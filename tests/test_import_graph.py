"""The import graph stays a tree of layers (issue 33 part 2): no import cycle in engine/ and
app/, TYPE_CHECKING imports counted, no arrow from a lower layer up into a higher one, and
every engine module imports in a fresh interpreter once what it imports is loaded.

The analysis is scripts/import_graph.py's (`python scripts/import_graph.py` prints it); these
tests run it on the tree, and on tiny packages written here to show that it sees a cycle.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Cycles (each as its sorted module list) and back-arrows ((importer, imported)) that another
# part of issue 33 is still removing. Each entry names who removes it; the list ends empty.
PENDING_CYCLES: list[list[str]] = []
PENDING_ARROWS: list[tuple[str, str]] = []


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "import_graph", ROOT / "scripts" / "import_graph.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


import_graph = _load_script()


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return import_graph.graph()


@pytest.fixture(scope="module")
def typed_edges() -> dict[str, set[str]]:
    return import_graph.graph(typing=True)


def test_import_graph_has_no_cycles_counting_type_checking_imports(typed_edges):
    # the graph with TYPE_CHECKING imports holds every edge of the one without: no cycle here
    # is no cycle there either
    found = import_graph.cycles(typed_edges)
    assert [c for c in found if c not in PENDING_CYCLES] == []
    assert [c for c in PENDING_CYCLES if c not in found] == [], "gone: take it off PENDING_CYCLES"


def test_import_graph_has_no_back_arrows(edges):
    found = import_graph.back_arrows(edges)
    assert [a for a in found if a not in PENDING_ARROWS] == []
    assert [a for a in PENDING_ARROWS if a not in found] == [], "gone: take it off PENDING_ARROWS"


def test_every_engine_module_imports_after_what_it_imports(edges):
    # one fresh interpreter for all (one each would take minutes): each module is imported
    # once the modules it imports are, so a failure names the module whose own body fails
    order = [
        m
        for m in import_graph.import_order(edges)
        if (m == "engine" or m.startswith("engine.")) and not m.endswith("__main__")
    ]
    script = textwrap.dedent("""
        import importlib, sys, traceback
        for name in sys.argv[1:]:
            try:
                importlib.import_module(name)
            except BaseException:
                sys.exit(f"importing {name} failed:\\n{traceback.format_exc()}")
    """)
    run = subprocess.run(
        [sys.executable, "-c", script, *order],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-4000:]


# -- the analysis itself, on tiny packages -----------------------------------------------------


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_import_graph_sees_a_cycle_through_a_lazy_import(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from . import b\n",
            "pkg/b.py": "def f():\n    from .a import x  # lazy: still an arrow\n",
            "pkg/c.py": "from .b import f\n",
        },
    )
    edges = import_graph.graph(root=root, packages=("pkg",))
    assert edges["pkg.a"] == {"pkg.b"} and edges["pkg.b"] == {"pkg.a"}
    assert import_graph.cycles(edges) == [["pkg.a", "pkg.b"]]


def test_import_graph_counts_type_checking_imports_only_when_asked(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
            "pkg/b.py": "from .a import A\n",
        },
    )
    assert import_graph.cycles(import_graph.graph(root=root, packages=("pkg",))) == []
    assert import_graph.cycles(import_graph.graph(typing=True, root=root, packages=("pkg",))) == [
        ["pkg.a", "pkg.b"]
    ]


def test_import_graph_orders_modules_after_their_imports_and_sees_back_arrows(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core.py": "import json\n",
            "pkg/mid.py": "from . import core\n",
            "pkg/top/__init__.py": "from ..mid import x\nfrom .. import core\n",
            "pkg/low.py": "def f():\n    from .top import y  # the library calling up into a command\n",
        },
    )
    edges = import_graph.graph(root=root, packages=("pkg",))
    order = import_graph.import_order(edges)
    assert (
        order.index("pkg.core")
        < order.index("pkg.mid")
        < order.index("pkg.top")
        < order.index("pkg.low")
    )
    layers = {"pkg": 0, "pkg.top": 1}
    assert import_graph.back_arrows(edges, layers, facades=()) == [("pkg.low", "pkg.top")]
