"""wait_until for the screenshot scripts: run the Qt event loop until a condition holds."""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QEventLoop, QTimer


def wait_until(cond: Callable[[], object], timeout: float = 120.0) -> bool:
    """Spin the event loop in 20 ms steps until cond() is true (True) or timeout s pass (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        loop = QEventLoop()
        QTimer.singleShot(20, loop.quit)
        loop.exec()
        if cond():
            return True
    return False
