"""QApplication, settings, AppContext and MainWindow; the PyInstaller entry point."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .context import AppContext
    from .engine_api import EngineApi

APP_NAME = "ggstation"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", help="GGUF file to load at start")
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="load a model, chat, start the server, make one request, exit 0 on success",
    )
    parser.add_argument(
        "--theme", choices=("system", "light", "dark"), help="override the colour scheme"
    )
    parser.add_argument(
        "--data-dir", help="where conversations and settings live (default: user data dir)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=APP_NAME)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.self_test and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setOrganizationName(APP_NAME)
    app.setApplicationName(APP_NAME)
    app.setDesktopFileName(APP_NAME)
    from .engine_adapter import EngineAdapter

    engine = EngineAdapter()
    if args.model:
        try:
            args.model = engine.resolve_model(args.model)
        except Exception as e:  # unknown name or missing file: say so before any window opens
            print(f"error: {e}", file=sys.stderr)
            return 1
    data_dir = args.data_dir or (
        tempfile.mkdtemp(prefix="ggstation-selftest-") if args.self_test else None
    )
    ctx = build_context(data_dir, engine)
    from .main_window import MainWindow
    from .theme import apply_theme, follow_system

    apply_theme(app, args.theme or ctx.settings.theme)
    follow_system(app, lambda: args.theme or ctx.settings.theme)
    window = MainWindow(ctx)
    window.show()
    if args.self_test:
        from .self_test import SelfTest

        test = SelfTest(window, args.model)
        test.start()
        app.exec()
        return test.exit_code
    if args.model:
        window.picker.open_path(args.model)
    return app.exec()


def build_context(data_dir: str | None = None, engine: EngineApi | None = None) -> AppContext:
    from PySide6.QtCore import QSettings, QStandardPaths

    from .context import AppContext
    from .data_folder import open_data_folder
    from .engine_adapter import EngineAdapter

    if data_dir:
        folder = open_data_folder(Path(data_dir))
    else:
        base = Path(
            QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)
        )
        folder = open_data_folder(base, QSettings())
    return AppContext(engine or EngineAdapter(), folder.store, folder.settings, folder.notices)


if __name__ == "__main__":
    sys.exit(main())
