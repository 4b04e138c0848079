"""The router's side of the Hugging Face cache: check that a model can be downloaded, download
it with progress, and remove a cached model (POST /models and DELETE /models of llama-server's
router), and the cached models the router's catalogue lists (engine/router/presets.py). The
transfers themselves are engine/hub/client.py's; tests swap HubAccess for a stand-in."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path


class HubAccess:
    """What the router needs of the Hub; validate and fetch raise HubError (an EngineError)."""

    def validate(self, spec: str) -> tuple[object, str]:
        """(the model file, its download URL) for "user/repo[:QUANT]"."""
        from ..hub import client as hub

        file = hub.resolve(spec)
        url = f"{hub.endpoint()}/{file.repo_id}/resolve/{file.revision}/{file.filename}"
        return file, url

    def fetch(
        self, file: object, progress: Callable[[int, int], None], cancel: threading.Event
    ) -> Path:
        from ..hub import client as hub

        return hub.download(file, progress=progress, cancel=cancel)  # type: ignore[arg-type]

    def remove(self, spec: str) -> bool:
        """Delete every part of the cached model `spec` (its links, and the blobs they lead to
        in the cache); False if none was there. Nothing outside the cache is deleted."""
        from ..hub import client as hub

        removed = False
        for f in hub.cached_models():
            if f.spec == spec and f.local_path is not None:
                removed = hub.remove_cached(f) or removed
        return removed


def discover_hub_models() -> dict[str, Path]:
    """The Hugging Face cache's complete GGUF models, named as llama-server names them
    ("user/repo:Q4_K_M", engine/hub/client.py cached_models)."""
    try:
        from ..hub.client import cached_models
    except ImportError:  # huggingface_hub missing: no cache to list
        return {}
    out: dict[str, Path] = {}
    for f in cached_models():
        if f.local_path is not None:
            out.setdefault(f.spec, f.local_path)
    return out
