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
import contextlib
import io
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .. import params
from ..errors import EngineError
from ..server import flags
from .common import add_gpu_args, add_int8_arg, add_mem_check_arg, gpu_kwargs, init_threads, mem_check

log = logging.getLogger("ggstation.serve")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="run the HTTP server (llama-server / OpenAI compatible)",
        description="HTTP server compatible with llama-server and the OpenAI API. Accepts every "
        "llama-server flag; flags for features ggstation lacks (LoRA, tensor split...) are "
        "accepted and reported as ignored.",
    )
    params.add_model_args(p)
    params.add_context_args(p)
    params.add_generation_args(p, prompt=False)
    params.add_sampling_args(p)
    params.add_chat_args(p)
    add_gpu_args(p)
    flags.add_server_args(p)
    add_mem_check_arg(p)
    add_int8_arg(p)
    p.set_defaults(parallel=-1, ignored=[], refused=[], env_error=None, accepts_unknown_flags=True, run=run)
    _apply_env_defaults(p)
    return p


def _apply_env_defaults(p: argparse.ArgumentParser) -> None:
    """LLAMA_ARG_* variables become defaults, so flags on the command line still win."""
    extra = flags.env_argv(p, [])
    if not extra:
        return
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            base, from_env = p.parse_args([]), p.parse_args(extra)
    except SystemExit:
        p.set_defaults(env_error=f"invalid LLAMA_ARG_* environment variable: {err.getvalue().strip()}")
        return
    changed = {k: v for k, v in vars(from_env).items() if vars(base).get(k) != v}
    p.set_defaults(**changed)


# -- start-up ----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    _setup_logging(args)
    _check_flags(args)  # 1. flags parsed by cli.py; reject what cannot work
    if not args.ready_json:  # a router's children inherit AIP_* but listen where the router says
        from ..server import vertex

        args.port = vertex.listen_port(args.port)  # Vertex AI prediction mode: AIP_HTTP_PORT wins
    if args.ray is not None:
        from ..cluster.launch import run_cluster

        return run_cluster(args)
    if not args.model and params.hf_repo(args) is None:
        return run_router(args)
    _clamp_batch(args)  # 2.
    n_slots = 4 if args.parallel < 0 else args.parallel  # 3. auto parallelism
    n_threads = _init_backend(args)  # 4.-5.
    options = _server_options(args)
    from ..server import ServerState, listen

    state = ServerState(options)  # 6. server context (the scheduler joins it once loaded)
    handle = listen(state, args.host, args.port, app=_app(state))  # 7.-9. HTTP set up, routes, listening
    _announce(args, "listening", handle)
    if args.ready_json:  # a router's child: heartbeats out, "exit" in
        from ..router.supervisor import start_child_monitor

        start_child_monitor(lambda: os.kill(os.getpid(), signal.SIGTERM))
    print(f"main: server is listening on {handle.url} - loading the model", file=sys.stderr)
    _discover_devices(args.n_gpu_layers != 0)  # 4. the registry, while /health answers "loading"
    try:
        scheduler = _load(args, state, n_threads, n_slots)  # 10.
    except KeyboardInterrupt:
        handle.stop(2.0)
        return 130
    except Exception as e:
        state.set_failed(str(e))
        _announce(args, "failed", handle, error=str(e))  # a router shows this, not just the exit code
        handle.stop(2.0)
        raise e if isinstance(e, EngineError) else EngineError(f"cannot load the model: {e}") from e
    stopper = _install_signals(scheduler)  # 11.
    _announce(args, "ready", handle)
    if args.ready_json and state.sleep is not None:  # a router tracks its children's sleep
        state.sleep.on_change = lambda asleep: _announce(args, "sleeping" if asleep else "ready", handle)
    print(f"main: model loaded; {n_slots} slots, n_ctx_seq {scheduler.n_ctx_seq}; "
          f"server ready at {handle.url}", file=sys.stderr)
    try:
        scheduler.run()  # 12. the task loop, on the main thread
    finally:
        handle.stop(min(3.0, max(0.5, stopper.deadline - time.monotonic())))
    print("main: server stopped", file=sys.stderr)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """`serve` flags parsed as the CLI parses them (unknown flags kept in `unknown_flags`)."""
    args, unknown = _serve_parser().parse_known_args(argv)
    args.unknown_flags = unknown
    return args


def in_process_server(argv: list[str], verify: Callable[[Path], None] | None = None):
    """One model's server without a listener, for a Ray replica (engine/cluster/replica.py):
    the model resolved (a file, or pulled from the starter-model store or the Hub on this
    machine), `verify(path)`-ed, loaded, its scheduler looping on a thread of its own.

    Returns:
        (scheduler, the single-model ASGI app).
    """
    args = parse_args(argv)
    _setup_logging(args)
    _check_flags(args)
    path = params.resolve_model_path(args)
    if verify is not None:
        verify(path)
    args.model, args.hf_repo = str(path), None
    n_slots = 4 if args.parallel < 0 else args.parallel
    n_threads = _init_backend(args)
    from ..server import ServerState

    state = ServerState(_server_options(args))
    scheduler = _load(args, state, n_threads, n_slots).start(name=f"ggstation-scheduler {args.alias or path.name}")
    return scheduler, _app(state)


def _app(state):
    from ..server.http import create_app

    app = create_app(state)
    if state.options.sleep_idle_seconds >= 0:  # llama-server: -1 disables, 0 sleeps at once
        from ..server import sleep

        sleep.install(app, state, state.options.sleep_idle_seconds)
    return app


def _setup_logging(args) -> None:
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _check_flags(args) -> None:
    if args.env_error:
        raise EngineError(args.env_error)
    if args.refused:
        raise EngineError(
            f"{args.refused[0]}: downloading models is not supported by ggstation serve; "
            "download the .gguf yourself and pass it with -m FILE (or `ggstation models pull NAME`)"
        )
    if not 0 <= args.port <= 65535:
        raise EngineError(f"invalid --port {args.port}: must be 0..65535")
    if args.pooling == "rank":
        raise EngineError("--pooling rank (reranking) is not supported")
    for flag in dict.fromkeys(args.ignored):
        log.warning("%s is accepted for llama-server compatibility but ignored (not supported by "
                    "ggstation's CPU engine)", flag)
    if args.unknown_flags:
        log.warning("unknown arguments ignored: %s (not llama-server flags ggstation knows; check the "
                    "spelling if you meant one)", " ".join(args.unknown_flags))
    for env in flags.ignored_env():
        log.warning("environment variable %s is ignored (not supported by ggstation)", env)


def _clamp_batch(args) -> None:
    if args.embedding and args.batch_size > args.ubatch_size:
        print(f"main: embedding mode: setting n_batch = n_ubatch = {args.ubatch_size}", file=sys.stderr)
        args.batch_size = args.ubatch_size


def _init_backend(args) -> int:
    n_threads = init_threads(args.threads)
    gpu = f", offloading {args.n_gpu_layers} layers (-ngl)" if args.n_gpu_layers != 0 else ""
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


def _api_keys(args) -> tuple[str, ...]:
    keys = [k.strip() for raw in args.api_key for k in raw.split(",") if k.strip()]
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                keys += [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
        except OSError as e:
            raise EngineError(f"cannot read --api-key-file '{args.api_key_file}': {e.strerror}") from None
    return tuple(dict.fromkeys(keys))


def _server_options(args):
    from ..server import ServerOptions

    kwargs = {}
    if args.chat_template_kwargs:
        try:
            kwargs = json.loads(args.chat_template_kwargs)
        except ValueError as e:
            raise EngineError(f"--chat-template-kwargs is not valid JSON: {e}") from None
        if not isinstance(kwargs, dict):
            raise EngineError("--chat-template-kwargs must be a JSON object")
        from ..server.requests import RESERVED_TEMPLATE_VARIABLES

        for key in kwargs.keys() & RESERVED_TEMPLATE_VARIABLES.keys():
            # refused at start-up, not as a 400 on every chat request afterwards
            raise EngineError(f"--chat-template-kwargs may not set {key!r}: the server sets it "
                              f"({RESERVED_TEMPLATE_VARIABLES[key]})")
    reasoning = getattr(args, "reasoning", "auto")
    if reasoning != "auto":  # llama-server: --reasoning on/off sets the template's enable_thinking
        kwargs.setdefault("enable_thinking", reasoning == "on")
    if getattr(args, "reasoning_effort", "default") != "default":
        kwargs.setdefault("reasoning_effort", args.reasoning_effort)
    if getattr(args, "reasoning_preserve", None) is not None:
        kwargs.setdefault("preserve_reasoning", args.reasoning_preserve)
    cors = flags.cors_origins(args)
    keys = _api_keys(args)
    if cors == ("*",) and not keys:  # llama-server's own warning: any page a browser opens can call us
        log.warning("security: no API key is set and CORS allows all origins; set --api-key or --cors-origins")
    return ServerOptions(
        api_keys=keys,
        cors_origins=cors,
        cors_methods=args.cors_methods,
        cors_headers=args.cors_headers,
        cors_credentials=args.cors_credentials,
        cors_proxy=args.ui_mcp_proxy,
        model_tags=tuple(dict.fromkeys(t.strip() for t in (args.tags or "").split(",") if t.strip())),
        alias=args.alias,
        metrics=args.metrics,
        slots=args.slots,
        props_writable=args.props,
        embeddings=args.embedding,
        pooling=args.pooling,
        embd_normalize=args.embd_normalize,
        cache_prompt=args.cache_prompt,
        n_predict=args.n_predict,
        max_body_bytes=int(args.max_body_mib * 1024 * 1024),
        default_sampling=params.to_sampling_params(args),
        chat_template_kwargs=kwargs,
        api_prefix=args.api_prefix or "",
        verbose=bool(args.verbose),
        prefill_assistant=args.prefill_assistant,
        slot_save_path=_slot_save_path(args),
        sleep_idle_seconds=args.sleep_idle_seconds,
    )


def _slot_save_path(args) -> str | None:
    """--slot-save-path, an existing directory as llama-server requires; None when not given."""
    if not args.slot_save_path:
        return None
    if not os.path.isdir(args.slot_save_path):
        raise EngineError(f"--slot-save-path: not a directory: {args.slot_save_path}")
    return args.slot_save_path


def _load(args, state, n_threads: int, n_slots: int):
    from ..context import Context
    from ..model import load_model
    from ..scheduler import Scheduler

    t0 = time.perf_counter()
    path = params.resolve_model_path(args)
    model = load_model(path, n_threads=n_threads, **gpu_kwargs(args))
    try:
        ctx = Context(model, params.to_context_params(args, n_seq_max=n_slots, check_memory=mem_check(args)))
    except BaseException:
        model.close()
        raise
    scheduler = Scheduler(ctx, model.tokenizer, model=model, n_slots=n_slots,
                          slot_prompt_similarity=args.slot_prompt_similarity,
                          context_shift=args.context_shift, n_keep=args.keep)
    state.set_ready(scheduler, _chat_template(args, model))
    log.info("model %s loaded in %.2f s", path, time.perf_counter() - t0)
    return scheduler


def _chat_template(args, model):
    from ..errors import TemplateError

    override = params.chat_template_override(args)
    try:
        from ..tokenizer.chat_template import ChatTemplate

        template = ChatTemplate.from_gguf(model.gguf, override=override, any_text=bool(args.jinja))
        if override is not None and template.name == "custom" and "{" not in override:
            # llama-server --jinja takes any text as a template; a mistyped name ends up here too
            log.warning("--chat-template %r is no built-in name, file or Jinja: used as the template text",
                        override[:60])
        if not args.jinja and template.family and template.name != template.family:
            # llama-server --no-jinja renders the format it detects in the template with its own
            # code (no default system prompt, no template logic): the built-in of that format
            template = ChatTemplate.from_gguf(model.gguf, override=template.family)
        return template
    except ImportError:
        log.warning("chat templates are not available; /v1/chat/completions will fail")
    except TemplateError as e:
        if override is not None:
            raise
        log.warning("the model's chat template cannot be used (%s); chat endpoints will fail", e)
    return None


def _announce(args, event: str, handle, **extra) -> None:
    """One JSON line on stdout per start-up milestone, for a supervising router."""
    if args.ready_json:
        print(json.dumps({"event": event, "port": handle.port, "url": handle.url, **extra}), flush=True)


# -- router mode -------------------------------------------------------------------------


def run_router(args) -> int:
    """No -m: serve the models of the Hugging Face cache, --models-dir and --models-preset
    through one child server per model (engine/router/supervisor.py)."""
    from ..router.presets import router_catalogue
    from ..router.proxy import create_router_app
    from ..router.supervisor import Router
    from ..server import ServerState, listen

    catalogue = router_catalogue(_serve_parser(), args, flags.ENV)
    router = Router(catalogue=catalogue.build, models_max=args.models_max, autoload=args.models_autoload)
    if not router.children:
        log.warning("router: no models yet (none in the Hugging Face cache, --models-dir or --models-preset); "
                    "add some and list them with GET /models?reload=1")
    router.start()
    state = ServerState(_server_options(args))
    handle = listen(state, args.host, args.port, app=create_router_app(router, state))
    _announce(args, "ready", handle)
    router.load_startup_models()
    print(f"main: router listening on {handle.url}; {len(router.children)} models: "
          f"{', '.join(router.children)}", file=sys.stderr)
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


def _serve_parser() -> argparse.ArgumentParser:
    """A fresh `serve` parser: the router reads its options table and defaults from it."""
    root = argparse.ArgumentParser(add_help=False)
    return add_parser(root.add_subparsers())


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
