"""`ggstation gui` (the default command): the PySide6 desktop app. Qt is imported only here, lazily."""

from __future__ import annotations

import argparse

from .. import params
from .common import model_path


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("gui", help="open the desktop app (the default)")
    parser.add_argument("-m", "--model", help="GGUF file to load at start")
    params.add_hf_args(parser)
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="load a model, chat, start the server, make one request; exit 0 on success",
    )
    parser.add_argument(
        "--theme", choices=("system", "light", "dark"), help="override the colour scheme"
    )
    parser.add_argument(
        "--data-dir", help="where conversations and settings live (default: user data dir)"
    )
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from app.main import run as run_app

    if params.model_source(args).hf_repo is not None:
        # fetched (with the fit check and a progress bar) before the window opens, as `chat -hf`
        args.model = str(model_path(args))

    return run_app(args)
