"""The server's start-up steps that `ggstation serve` (engine/commands/serve.py) and a Ray
replica (engine/cluster/replica.py) share: the flags checked, the ServerOptions built from
them, the model loaded into a ServerState (engine.init.init_from_params) and the ASGI app.

Everything here logs; printing start-up lines for a person is the command's job.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import params
from ..errors import EngineError
from . import flags

if TYPE_CHECKING:
    from ..scheduler import Scheduler
    from .state import ServerOptions, ServerState

log = logging.getLogger("ggstation.serve")


def setup_logging(args: argparse.Namespace) -> None:
    """-v: the server's INFO lines on stderr; WARNING and above otherwise."""
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(
        level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def check_flags(args: argparse.Namespace) -> None:
    """Refuse what cannot work; log what is accepted and ignored.

    Raises:
        EngineError: a bad LLAMA_ARG_* variable, a download flag, a bad port, --pooling rank.
    """
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
        log.warning(
            "%s is accepted for llama-server compatibility but ignored (not supported by "
            "ggstation's CPU engine)",
            flag,
        )
    if args.unknown_flags:
        log.warning(
            "unknown arguments ignored: %s (not llama-server flags ggstation knows; check the "
            "spelling if you meant one)",
            " ".join(args.unknown_flags),
        )
    for env in flags.ignored_env():
        log.warning("environment variable %s is ignored (not supported by ggstation)", env)


def _api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    keys = [k.strip() for raw in args.api_key for k in raw.split(",") if k.strip()]
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                keys += [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
        except OSError as e:
            raise EngineError(
                f"cannot read --api-key-file '{args.api_key_file}': {e.strerror}"
            ) from None
    return tuple(dict.fromkeys(keys))


def _template_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """--chat-template-kwargs, with what --reasoning, --reasoning-effort and
    --reasoning-preserve set in the template (a key given in the JSON wins)."""
    kwargs = {}
    if args.chat_template_kwargs:
        try:
            kwargs = json.loads(args.chat_template_kwargs)
        except ValueError as e:
            raise EngineError(f"--chat-template-kwargs is not valid JSON: {e}") from None
        if not isinstance(kwargs, dict):
            raise EngineError("--chat-template-kwargs must be a JSON object")
        from .requests import RESERVED_TEMPLATE_VARIABLES

        for key in kwargs.keys() & RESERVED_TEMPLATE_VARIABLES.keys():
            # refused at start-up, not as a 400 on every chat request afterwards
            raise EngineError(
                f"--chat-template-kwargs may not set {key!r}: the server sets it "
                f"({RESERVED_TEMPLATE_VARIABLES[key]})"
            )
    if (
        args.reasoning != "auto"
    ):  # llama-server: --reasoning on/off sets the template's enable_thinking
        kwargs.setdefault("enable_thinking", args.reasoning == "on")
    if args.reasoning_effort != "default":
        kwargs.setdefault("reasoning_effort", args.reasoning_effort)
    if args.reasoning_preserve is not None:
        kwargs.setdefault("preserve_reasoning", args.reasoning_preserve)
    return kwargs


def server_options(args: argparse.Namespace, p: params.CommonParams | None = None) -> ServerOptions:
    """The ServerOptions of parsed `serve` flags (`p`: their CommonParams, when made already).

    Raises:
        EngineError: bad --chat-template-kwargs, an unreadable --api-key-file, a
            --slot-save-path that is no directory.
    """
    from .state import ServerOptions

    p = p or params.common_params(args)
    kwargs = _template_kwargs(args)
    cors = flags.cors_origins(args)
    keys = _api_keys(args)
    if (
        cors == ("*",) and not keys
    ):  # llama-server's own warning: any page a browser opens can call us
        log.warning(
            "security: no API key is set and CORS allows all origins; set --api-key or --cors-origins"
        )
    return ServerOptions(
        api_keys=keys,
        cors_origins=cors,
        cors_methods=args.cors_methods,
        cors_headers=args.cors_headers,
        cors_credentials=args.cors_credentials,
        cors_proxy=args.ui_mcp_proxy,
        model_tags=tuple(
            dict.fromkeys(t.strip() for t in (args.tags or "").split(",") if t.strip())
        ),
        alias=args.alias,
        metrics=args.metrics,
        slots=args.slots,
        props_writable=args.props,
        embeddings=args.embedding,
        pooling=args.pooling,
        embd_normalize=args.embd_normalize,
        cache_prompt=args.cache_prompt,
        n_predict=p.n_predict,
        max_body_bytes=int(args.max_body_mib * 1024 * 1024),
        default_sampling=p.sampling,
        chat_template_kwargs=kwargs,
        api_prefix=args.api_prefix or "",
        verbose=p.verbose,
        prefill_assistant=args.prefill_assistant,
        slot_save_path=_slot_save_path(args),
        sleep_idle_seconds=args.sleep_idle_seconds,
        media_path=args.media_path,
    )


def _slot_save_path(args: argparse.Namespace) -> str | None:
    """--slot-save-path, an existing directory as llama-server requires; None when not given."""
    if not args.slot_save_path:
        return None
    if not os.path.isdir(args.slot_save_path):
        raise EngineError(f"--slot-save-path: not a directory: {args.slot_save_path}")
    return args.slot_save_path


def build_app(state: ServerState):
    """The single-model ASGI app, with the sleep middleware when --sleep-idle-seconds asks."""
    from .http import create_app

    app = create_app(state)
    if state.options.sleep_idle_seconds >= 0:  # llama-server: -1 disables, 0 sleeps at once
        from . import sleep

        sleep.install(app, state, state.options.sleep_idle_seconds)
    return app


def load(
    args: argparse.Namespace, p: params.CommonParams, state: ServerState, path: Path, n_threads: int
) -> Scheduler:
    """The model at `path` loaded with its context and scheduler (-np -1: params.AUTO_SLOTS),
    made the state's; the scheduler is not started. `args`: the server's own flags."""

    from ..init import SchedulerParams, init_from_params

    t0 = time.perf_counter()
    slots = SchedulerParams(
        p.n_slots,
        slot_prompt_similarity=args.slot_prompt_similarity,
        context_shift=p.context_shift,
        n_keep=p.n_keep,
    )
    loaded = init_from_params(path, params.init_params(p, n_threads, slots))
    assert loaded.scheduler is not None
    state.set_ready(loaded.scheduler, chat_template(p, loaded.model), loaded.projector)
    if loaded.projector is not None:
        log.info(
            "loaded multimodal projector %s (%s)",
            loaded.projector.path,
            loaded.projector.projector_type,
        )
    log.info("model %s loaded in %.2f s", path, time.perf_counter() - t0)
    return loaded.scheduler


def chat_template(p: params.CommonParams, model):
    """The template chat requests are rendered with (--chat-template, --jinja), None when the
    model's cannot be used (chat endpoints then fail)."""
    from ..errors import TemplateError

    override = params.chat_template_override(p)
    try:
        from ..tokenizer.chat_template import ChatTemplate

        template = ChatTemplate.from_gguf(model.gguf, override=override, any_text=p.use_jinja)
        if override is not None and template.name == "custom" and "{" not in override:
            # llama-server --jinja takes any text as a template; a mistyped name ends up here too
            log.warning(
                "--chat-template %r is no built-in name, file or Jinja: used as the template text",
                override[:60],
            )
        if not p.use_jinja and template.family and template.name != template.family:
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


def in_process_server(argv: list[str], verify: Callable[[Path], None] | None = None):
    """One model's server without a listener, for a Ray replica (engine/cluster/replica.py):
    the model resolved (a file, or pulled from the starter-model store or the Hub on this
    machine, logged), `verify(path)`-ed, loaded, its scheduler looping on a thread of its own.

    Returns:
        (scheduler, the single-model ASGI app).
    """
    from ..hub.pull import resolve_model_paths
    from ..init import init_threads
    from .state import ServerState

    args = flags.parse_serve_args(argv)
    p = params.common_params(args)
    setup_logging(args)
    check_flags(args)
    # as `serve` does: with -hf (no -mm, no --no-mmproj) the repository's mmproj comes too
    found = resolve_model_paths(
        params.model_source(p, p.n_ctx), mmproj=p.mmproj is None and p.mmproj_auto
    )
    path = found.model
    if found.mmproj is not None:
        p = dataclasses.replace(p, mmproj=str(found.mmproj))
    if verify is not None:
        verify(path)
    n_threads = init_threads(p.n_threads, warn=log.warning)
    log.info("backend numba-cpu, %d threads", n_threads)
    state = ServerState(server_options(args, p))
    scheduler = load(args, p, state, path, n_threads).start(
        name=f"ggstation-scheduler {args.alias or path.name}"
    )
    return scheduler, build_app(state)
