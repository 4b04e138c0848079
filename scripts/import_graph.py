"""The import graph of engine/ and app/: its cycles and the arrows that point up the layers.

Every ``import`` is counted, module-level and lazy (inside a function) alike, because a lazy
import is still a dependency: it only hides the cycle until the call. Imports under
``if TYPE_CHECKING:`` never run, so the graph leaves them out unless asked (``typing=True``);
a cycle through them still ties the modules together for the reader and the type checker, so
both kinds count. ``python scripts/import_graph.py`` prints the cycles (strongly connected
components of more than one module) and the back-arrows; tests/test_import_graph.py keeps
both at zero, and imports every engine module in `import_order`.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "app")

# Lower layers never import higher ones. A module's layer is that of its longest matching prefix.
LAYERS: dict[str, int] = {
    "engine": 0,  # the core: gguf, quants, models, ops, context, scheduler, sampling, grammar...
    "engine.backends": 0,
    "engine.hub": 1,
    "engine.remote": 1,
    "engine.server": 2,
    "engine.router": 3,
    "engine.tools": 3,
    "engine.cluster": 3,
    "app": 4,  # the desktop app: the engine through its public API
    "engine.commands": 5,  # the command line sits on top: `ggstation gui` starts the app
    "engine.cli": 5,
    "engine.__main__": 5,
}
# the engine's package face re-exports the library lazily; it sits above the core it names
FACADES = {"engine"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT, packages: Sequence[str] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of `packages` under `root`."""
    found = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            # the generated kernels (engine/quants/generated/<type>.py: megabytes that only
            # importlib loads, through QUANT_TYPES) are left out; their package's module table
            # stays, so that importing it is not read as importing engine.quants
            if "generated" in path.parts and path.name != "__init__.py":
                continue
            found[module_name(path, root)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST, typing: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if not typing and isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(mod: str, path: Path, known: dict[str, Path], typing: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in _import_nodes(tree, typing):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for target in targets:
            hit = _resolve(target, known)
            if hit and hit != mod:
                out.add(hit)
    return out


def graph(
    typing: bool = False, root: Path = ROOT, packages: Sequence[str] = PACKAGES
) -> dict[str, set[str]]:
    """Module -> the modules it imports; with ``typing``, the TYPE_CHECKING-only imports too."""
    known = modules(root, packages)
    return {mod: imports_of(mod, path, known, typing) for mod, path in known.items()}


def components(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component (Tarjan, iterative), each sorted, in the order Tarjan
    completes them: a component comes after every component it imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    found.append(sorted(comp))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, the largest first."""
    return sorted((comp for comp in components(edges) if len(comp) > 1), key=len, reverse=True)


def import_order(edges: Mapping[str, set[str]]) -> list[str]:
    """Every module after the modules it imports (the modules of a cycle side by side)."""
    return [mod for comp in components(edges) for mod in comp]


def layer(mod: str, layers: Mapping[str, int] = LAYERS) -> int:
    best = ""
    for prefix in layers:
        if (mod == prefix or mod.startswith(prefix + ".")) and len(prefix) > len(best):
            best = prefix
    return layers[best]


def back_arrows(
    edges: Mapping[str, set[str]],
    layers: Mapping[str, int] = LAYERS,
    facades: Collection[str] = FACADES,
) -> list[tuple[str, str]]:
    """Imports from a lower layer into a higher one (the library calling up into the CLI...)."""
    return sorted(
        (src, dst)
        for src, dsts in edges.items()
        if src not in facades
        for dst in dsts
        if dst not in facades and layer(dst, layers) > layer(src, layers)
    )


def main() -> int:
    edges = graph()
    found = cycles(edges)
    typed = cycles(graph(typing=True))
    arrows = back_arrows(edges)
    for comp in found:
        print(f"cycle of {len(comp)}: {' '.join(comp)}")
    for comp in typed:
        print(f"cycle of {len(comp)}, counting TYPE_CHECKING imports: {' '.join(comp)}")
    for src, dst in arrows:
        print(f"back-arrow: {src} -> {dst}")
    print(
        f"{len(edges)} modules, {len(found)} cycles ({len(typed)} counting TYPE_CHECKING imports), "
        f"{len(arrows)} back-arrows"
    )
    return 1 if found or typed or arrows else 0


if __name__ == "__main__":
    sys.exit(main())
