"""The HTTP server (llama-server and OpenAI compatible), usable from the CLI and the GUI.

    from engine.server import start_server
    handle = start_server(scheduler, port=8080, api_keys=["secret"])   # shares the GUI's model
    print(handle.url); ...; handle.stop()

`ggstation serve` (engine/commands/serve.py) uses the lower-level pieces: a ServerState
that starts LOADING, `listen()` before the model loads, then `state.set_ready(scheduler)`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # lazy at run time (see _LAZY)
    from .http import ServerHandle
    from .state import ServerOptions

# Lazy: `ggstation serve --help` and the CLI parser must not pay for importing FastAPI.
_LAZY = {
    "PortInUseError": "http",
    "ServerHandle": "http",
    "create_app": "http",
    "listen": "http",
    "ServerOptions": "state",
    "ServerState": "state",
    "ServerStatus": "state",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def start_server(
    scheduler,
    host: str = "127.0.0.1",
    port: int = 8080,
    api_keys: Iterable[str] = (),
    cors: Iterable[str] | bool = (),
    *,
    options: ServerOptions | None = None,
    chat_template=None,
    request_log=None,
    projector=None,
) -> ServerHandle:
    """Serve an already-loaded model over HTTP on a background thread.

    Args:
        scheduler: an engine.scheduler.Scheduler whose loop is running (scheduler.start())
            and which carries its model.
        host, port: where to listen (port 0 picks a free port; see handle.port).
        api_keys: keys clients must send (Bearer or X-Api-Key); empty = no auth.
        cors: allowed origins, or True for "*"; empty/False = CORS off.
        options: full ServerOptions (api_keys/cors/request_log override its fields).
        chat_template: a ChatTemplate to use instead of the model's.
        request_log: callback(dict) after every request (method, path, status, duration_ms).
        projector: the model's engine.vision.Projector (its mmproj), for images in prompts.

    Returns:
        A ServerHandle (engine.server.http) with .url, .port and .stop().

    Raises:
        PortInUseError: the port is taken; the message suggests a free one.
    """
    from .http import create_app, listen
    from .state import ServerOptions, ServerState

    opts = options or ServerOptions()
    keys = tuple(k for k in api_keys if k)
    if keys:
        opts.api_keys = keys
    if cors is True:
        opts.cors_origins = ("*",)
    elif cors:
        opts.cors_origins = tuple(cors)
    if request_log is not None:
        opts.request_log = request_log
    state = ServerState(opts)
    state.set_ready(scheduler, chat_template, projector)
    app = create_app(state)
    if opts.sleep_idle_seconds >= 0:
        from . import sleep

        sleep.install(app, state, opts.sleep_idle_seconds)
    return listen(state, host, port, app=app)


__all__ = [
    "PortInUseError",
    "ServerHandle",
    "ServerOptions",
    "ServerState",
    "ServerStatus",
    "create_app",
    "listen",
    "start_server",
]
