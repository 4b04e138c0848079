"""Work around PySide6 6.12.0 on CPython < 3.12: it returns None, True and False without taking a
reference. Every call of a Qt method returning void (`setText`, `processEvents`, ...) drops one
reference to None, and every `Signal.emit()` drops one to True; after a few thousand calls CPython
aborts with "none_dealloc: deallocating None" (or bool_dealloc). 6.11.x is not affected, and from
CPython 3.12 these singletons are immortal.

Until a fixed PySide6 is released, give the three singletons reference counts that cannot run out.
They are never freed anyway, so the only effect is that the bug stops mattering.
"""

from __future__ import annotations

import ctypes
import sys

SPARE_REFS = 1 << 40  # ~10^12 void calls


def affected(pyside_version: tuple[int, ...]) -> bool:
    return sys.version_info < (3, 12) and tuple(pyside_version[:2]) == (6, 12)


def protect_none_refcount() -> bool:
    """Returns True when the workaround was applied."""
    try:
        import PySide6
    except ImportError:
        return False
    if not affected(PySide6.__version_info__) or getattr(sys, "_ggstation_none_protected", False):
        return False
    for singleton in (None, True, False):
        ctypes.c_ssize_t.from_address(
            id(singleton)
        ).value += SPARE_REFS  # ob_refcnt: PyObject's 1st field
    sys._ggstation_none_protected = True
    return True
