"""`ggstation` console entry point: the GUI by default, otherwise a subcommand from engine.commands.

Each subcommand lives in engine/commands/<name>.py and exposes `add_parser(subparsers)` and
`run(args) -> int`. The GUI is imported lazily so that headless commands never load Qt.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import sys

from .errors import EngineError

# name -> module under engine.commands; order is the order shown in --help
COMMANDS = ["gui", "serve", "chat", "generate", "bench", "perplexity", "tokenize", "info", "models"]


def _load(name: str):
    try:
        return importlib.import_module(f"engine.commands.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"engine.commands.{name}":
            return None
        raise


class _VersionAction(argparse.Action):
    """`--version`: the version and the facts a bug report needs, computed only when asked."""

    def __init__(
        self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None
    ):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from .version import version_text

        print(version_text())
        parser.exit()


def build_parser():
    from .params import ArgumentParser  # usage errors exit 1, as llama.cpp's tools do

    parser = ArgumentParser(
        prog="ggstation",
        description="Desktop inference workstation for GGUF models (numba CPU engine).",
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the version, Python/numba versions and the CPU numba targets, then exit",
    )
    # `serve` takes llama-server command lines, whose newer flags we may not know yet: it logs
    # them and starts (llama-server's own users expect a flag to never stop a deployment).
    parser.set_defaults(accepts_unknown_flags=False, unknown_flags=[])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        mod = _load(name)
        if mod is not None:
            mod.add_parser(sub)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`argv` parsed; a command that accepts unknown flags gets them in `unknown_flags`, any
    other command exits with argparse's usage error."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if not args.accepts_unknown_flags:
            parser.parse_args(argv)  # argparse's own error and exit status for a typo
        args.unknown_flags = unknown
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: this process's own, whose headless commands
    also exit fast: see _exit_without_collecting)."""
    own = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if own and argv[:1] in (["generate"], ["chat"]):  # collecting again once the model loaded
        from .commands.common import pause_collector

        pause_collector()
    parser = build_parser()
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["gui", *argv]
    args = parse_args(parser, argv)
    if own and args.command != "gui":  # Qt's teardown keeps the collector it was tested with
        atexit.register(_exit_without_collecting)
    try:
        return int(args.run(args) or 0)
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _exit_without_collecting() -> None:
    """Run last among the exit handlers registered after the command starts: the interpreter's
    shutdown then skips the garbage collections that would walk every object numba, the
    tokenizer and the model loaded. They cost 0.2-0.3 s of CPU (0.7-0.9 s of wall time on a
    busy machine) after a generate's last token; the memory goes back to the system anyway.
    Only for the process's own command line: a caller of main(argv) keeps its collector."""
    gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
