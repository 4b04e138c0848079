"""resource_path(): files under resources/, in the source tree or inside a PyInstaller bundle."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

from PySide6.QtGui import QIcon


def resources_dir() -> Path:
    bundle = getattr(sys, "_MEIPASS", None)  # set by PyInstaller's bootloader
    if bundle:
        return Path(bundle) / "resources"
    return Path(__file__).resolve().parent.parent / "resources"


def resource_path(name: str) -> Path:
    return resources_dir() / name


@cache
def icon(name: str) -> QIcon:
    return QIcon(str(resource_path(f"icons/{name}.svg")))


def stylesheet() -> str:
    path = resource_path("styles/app.qss")
    return path.read_text(encoding="utf-8") if path.exists() else ""
