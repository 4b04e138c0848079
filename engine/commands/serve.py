"""`ggstation serve`: the HTTP server, a drop-in for llama-server.

Start-up follows the seed (DESIGN.md): parse flags; clamp n_batch in embedding mode; -np -1
means 4 slots with a unified KV cache; initialise the backend; create the server state; set
up HTTP (API keys, middleware) and routes; start listening BEFORE the model loads (every
request gets 503 "Loading model" meanwhile); load the model and its context; install the
SIGINT/SIGTERM handlers; run the task loop on the main thread. The first SIGINT or SIGTERM
ends in-flight streams cleanly and exits 0; a second SIGINT exits at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time

from .. import params
from ..errors import EngineError
from ..server import flags, startup
from .common import init_threads, model_and_projector

log = logging.getLogger("ggstation.serve")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="run the HTTP server (llama-server / OpenAI compatible)",
        description="HTTP server compatible with llama-server and the OpenAI API. Accepts every "
        "llama-server flag; flags for features ggstation lacks (LoRA, tensor split...) are "
        "accepted and reported as ignored.",
    )
    flags.add_serve_args(p)
    p.set_defaults(run=run)
    return p


# -- start-up ----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    startup.setup_logging(args)
    startup.check_flags(args)  # 1. flags parsed by cli.py; reject what cannot work
    if not args.ready_json:  # a router's children inherit AIP_* but listen where the router says
        from ..server import vertex

        args.port = vertex.listen_port(args.port)  # Vertex AI prediction mode: AIP_HTTP_PORT wins
    if args.ray is not None:
        from ..cluster.launch import run_cluster

        return run_cluster(args)
    if not args.model and params.model_source(args).hf_repo is None:
        return run_router(args)
    _clamp_batch(args)  # 2.
    p = params.common_params(args)  # the shared flags, typed, passed down from here
    n_slots = p.n_slots  # 3. auto parallelism
    n_threads = _init_backend(p)  # 4.-5.
    options = startup.server_options(args, p)
    from ..server import ServerState, listen

    state = ServerState(options)  # 6. server context (the scheduler joins it once loaded)
    handle = listen(
        state, args.host, args.port, app=startup.build_app(state)
    )  # 7.-9. HTTP set up, routes, listening
    _announce(args, "listening", handle)
    if args.ready_json:  # a router's child: heartbeats out, "exit" in
        from ..router.supervisor import start_child_monitor

        start_child_monitor(lambda: os.kill(os.getpid(), signal.SIGTERM))
    print(f"main: server is listening on {handle.url} - loading the model", file=sys.stderr)
    _discover_devices(p.n_gpu_layers != 0)  # 4. the registry, while /health answers "loading"
    try:
        path, p = model_and_projector(p, p.n_ctx)  # with -hf, the repo's mmproj too
        scheduler = startup.load(args, p, state, path, n_threads)  # 10.
    except KeyboardInterrupt:
        handle.stop(2.0)
        return 130
    except Exception as e:
        state.set_failed(str(e))
        _announce(
            args, "failed", handle, error=str(e)
        )  # a router shows this, not just the exit code
        handle.stop(2.0)
        raise e if isinstance(e, EngineError) else EngineError(f"cannot load the model: {e}") from e
    stopper = _install_signals(scheduler)  # 11.
    _announce(args, "ready", handle)
    if args.ready_json and state.sleep is not None:  # a router tracks its children's sleep
        state.sleep.on_change = lambda asleep: _announce(
            args, "sleeping" if asleep else "ready", handle
        )
    print(
        f"main: model loaded; {n_slots} slots, n_ctx_seq {scheduler.n_ctx_seq}; "
        f"server ready at {handle.url}",
        file=sys.stderr,
    )
    try:
        scheduler.run()  # 12. the task loop, on the main thread
    finally:
        handle.stop(min(3.0, max(0.5, stopper.deadline - time.monotonic())))
    print("main: server stopped", file=sys.stderr)
    return 0


def _clamp_batch(args) -> None:
    if args.embedding and args.batch_size > args.ubatch_size:
        print(
            f"main: embedding mode: setting n_batch = n_ubatch = {args.ubatch_size}",
            file=sys.stderr,
        )
        args.batch_size = args.ubatch_size


def _init_backend(p: params.CommonParams) -> int:
    n_threads = init_threads(p.n_threads)
    gpu = f", offloading {p.n_gpu_layers} layers (-ngl)" if p.n_gpu_layers != 0 else ""
    print(f"main: backend numba-cpu, {n_threads} threads{gpu}", file=sys.stderr)
    return n_threads


def _discover_devices(gpus: bool) -> None:
    """Find the compute devices once (engine.backends.list_devices caches them) and say what
    was found: the CPU always, a GPU device with its memory or the reason it is unusable.
    GPUs only when layers are to be offloaded: probing loads their drivers (~100 MB resident
    for Mesa's llvmpipe) in a server that would never use them."""
    from ..backends import cpu_device, list_devices

    if not gpus:
        print("main: GPU devices not probed (-ngl 0; --list-devices lists them)", file=sys.stderr)
    for d in list_devices() if gpus else [cpu_device()]:
        if not d.available:
            print(f"main: device {d.name} ({d.backend}) not usable: {d.reason}", file=sys.stderr)
            continue
        mem = "" if d.total_bytes is None else f", {d.total_bytes >> 20} MiB"
        print(f"main: device {d.name} ({d.backend}): {d.description}{mem}", file=sys.stderr)


def _announce(args, event: str, handle, **extra) -> None:
    """One JSON line on stdout per start-up milestone, for a supervising router."""
    if args.ready_json:
        print(
            json.dumps({"event": event, "port": handle.port, "url": handle.url, **extra}),
            flush=True,
        )


# -- router mode -------------------------------------------------------------------------


def run_router(args) -> int:
    """No -m: serve the models of the Hugging Face cache, --models-dir and --models-preset
    through one child server per model (engine/router/supervisor.py)."""
    from ..router.presets import router_catalogue
    from ..router.proxy import create_router_app
    from ..router.supervisor import Router
    from ..server import ServerState, listen

    catalogue = router_catalogue(flags.serve_parser(), args, flags.ENV)
    router = Router(
        catalogue=catalogue.build, models_max=args.models_max, autoload=args.models_autoload
    )
    if not router.children:
        log.warning(
            "router: no models yet (none in the Hugging Face cache, --models-dir or --models-preset); "
            "add some and list them with GET /models?reload=1"
        )
    router.start()
    state = ServerState(startup.server_options(args))
    handle = listen(state, args.host, args.port, app=create_router_app(router, state))
    _announce(args, "ready", handle)
    router.load_startup_models()
    print(
        f"main: router listening on {handle.url}; {len(router.children)} models: "
        f"{', '.join(router.children)}",
        file=sys.stderr,
    )
    done = threading.Event()
    stopper = _Stopper(None, on_first=done.set)
    signal.signal(signal.SIGINT, stopper)
    signal.signal(signal.SIGTERM, stopper)
    while not done.wait(0.2):
        pass
    router.stop()
    handle.stop(2.0)
    print("main: router stopped", file=sys.stderr)
    return 0


class _Stopper:
    """SIGINT/SIGTERM: first one stops the scheduler (streams end cleanly), second exits."""

    def __init__(self, scheduler, on_first=None):
        self.scheduler = scheduler
        self.on_first = on_first
        self.count = 0
        self.deadline = float("inf")

    def __call__(self, signum, frame):
        self.count += 1
        if self.count > 1:
            if signum == signal.SIGINT:
                os._exit(130)
            return
        print(f"main: received {signal.Signals(signum).name}, shutting down", file=sys.stderr)
        self.deadline = time.monotonic() + 4.0
        if self.on_first is not None:
            self.on_first()
        if self.scheduler is not None:
            # never block here: this runs on the scheduler's own (main) thread
            threading.Thread(target=self.scheduler.stop, kwargs={"join_s": 0}, daemon=True).start()


def _install_signals(scheduler) -> _Stopper:
    stopper = _Stopper(scheduler)
    signal.signal(signal.SIGINT, stopper)
    signal.signal(signal.SIGTERM, stopper)
    return stopper
