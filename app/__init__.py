"""ggstation desktop app (PySide6). Talks to engine/ only through app/bridge.py and app/workers.py."""

from .qt_compat import protect_none_refcount

protect_none_refcount()
