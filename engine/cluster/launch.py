"""`ggstation serve --ray [ADDRESS]`: connect to (or start) Ray, start Serve's HTTP proxy on
--host/--port, deploy the ingress, wait for SIGINT/SIGTERM, then delete what it deployed.

A bad ADDRESS fails in seconds: the address is probed with a plain TCP connect first, and
`ray.init` itself runs under a deadline (CONNECT_TIMEOUT_S).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from ..errors import EngineError
from ..router.presets import MODEL_DESTS, RESERVED_DESTS, ModelSpec
from .ingress import APP, IngressConfig, ingress_app
from .plan import APP_PREFIX

log = logging.getLogger("ggstation.serve")

PROBE_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = float(os.environ.get("GGSTATION_RAY_CONNECT_TIMEOUT", "60"))


class ClusterError(EngineError):
    """Ray is missing, or the cluster cannot be reached."""


def run_cluster(args: argparse.Namespace) -> int:
    if args.ray and "RAY_AUTH_MODE" not in os.environ and _has_token():
        # as `ray start` does, and before Ray reads its configuration (at import): a cluster
        # started with a token (Ray's default for new clusters) takes only drivers that present it
        os.environ["RAY_AUTH_MODE"] = "token"
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ClusterError(
            "serve --ray needs Ray Serve: pip install 'ggstation[cluster]'"
        ) from None
    started = connect(args.ray or None)
    try:
        serve.start(http_options={"host": args.host, "port": args.port}, proxy_location="HeadOnly")
        config = ingress_config(args)
        serve.run(ingress_app(config), name=APP, route_prefix="/")
        print(
            f"main: Ray Serve listening on http://{args.host}:{args.port}; {len(config.specs)} models: "
            f"{', '.join(config.specs)}",
            file=sys.stderr,
            flush=True,
        )
        _wait_for_signal()
    finally:
        _cleanup(started)
        if started:
            ray.shutdown()
    print("main: server stopped", file=sys.stderr)
    return 0


def connect(address: str | None) -> bool:
    """ray.init on `address` (None: a new local instance); True when it started one.

    Raises:
        ClusterError: nothing answers at the address, or Ray did not connect in time.
    """
    import ray

    kw: dict[str, object] = dict(
        runtime_env={"env_vars": worker_env()}, logging_level=logging.WARNING, log_to_driver=False
    )
    if address is None:
        # on this thread: Ray's processes die with the thread that started them (PDEATHSIG)
        ray.init(include_dashboard=False, **kw)  # type: ignore[arg-type]
        return True
    if address != "auto":
        probe(address)
    result: dict[str, object] = {}

    def init() -> None:  # a connection only, which may hang: on a thread, under a deadline
        try:
            ray.init(address=address, **kw)  # type: ignore[arg-type]
            result["ok"] = True
        except Exception as e:  # shown to the user as the reason
            result["error"] = e

    t = threading.Thread(target=init, name="ray-connect", daemon=True)
    t.start()
    t.join(CONNECT_TIMEOUT_S)
    if t.is_alive():
        raise ClusterError(
            f"could not connect to Ray at {address} within {CONNECT_TIMEOUT_S:.0f} s"
        )
    if "error" in result:
        raise ClusterError(f"could not connect to Ray at {address}: {result['error']}")
    return False


def _has_token() -> bool:
    """Ray's auth token is at hand: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    return Path(path).is_file()


def probe(address: str) -> None:
    """A TCP connect to the host:port of `address` (host:port or ray://host:port)."""
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(
            f"--ray {address}: expected host:port (a `ray start --head` address) or ray://host:port"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as e:
        raise ClusterError(
            f"--ray {address}: nothing answers there ({e.strerror or e}); start the head node "
            "with `ray start --head` or check the address"
        ) from None


def worker_env() -> dict[str, str]:
    """Replicas import this very engine: the folder holding the `engine` package goes first on
    their path (an installed ggstation on every node makes this a no-op)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join([root, path]) if path else root}


def ingress_config(args: argparse.Namespace) -> IngressConfig:
    from ..router.presets import OptionTable, explicit_options, router_catalogue
    from ..server import flags
    from ..server.startup import server_options

    parser = flags.serve_parser()
    specs = router_catalogue(parser, args, flags.ENV).build() if not args.model else {}
    if args.model:  # one model, loaded at start
        table = OptionTable.from_parser(parser, flags.ENV)
        base = [
            pair
            for dest, value in explicit_options(parser, args, table)
            if dest not in RESERVED_DESTS | MODEL_DESTS
            for pair in table.render(dest, value)
        ]
        name = (args.alias or "").split(",")[0].strip() or Path(args.model).name.removesuffix(
            ".gguf"
        )
        specs[name] = ModelSpec(
            name, "models_dir", args.model, (("--model", args.model), *base), load_on_startup=True
        )
    options = server_options(args)
    return IngressConfig(
        specs=specs,
        options=options,
        models_max=args.models_max,
        autoload=args.models_autoload,
        env=worker_env(),
    )


def _wait_for_signal() -> None:
    done = threading.Event()

    def stop(signum, frame) -> None:
        print(f"main: received {signal.Signals(signum).name}, shutting down", file=sys.stderr)
        done.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while not done.wait(0.2):
        pass


def _cleanup(started: bool) -> None:
    """Delete the ingress and every model application (on a shared cluster, nothing else)."""
    from ray import serve

    try:
        if started:
            serve.shutdown()
            return
        for name in serve.status().applications:
            if name == APP or name.startswith(APP_PREFIX):
                serve.delete(name, _blocking=False)
    except Exception:  # the cluster went away first: nothing left to delete
        log.debug("cleanup failed", exc_info=True)
