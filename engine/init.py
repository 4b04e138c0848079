"""One way to build an engine from its parameters (llama.cpp's common_init_from_params).

`init_from_params(path, params)` loads the model, builds its context and, when the parameters
ask for one, the scheduler that serves it; when a step fails, what the earlier ones made is
closed again. Every entry point builds its engine here: `ggstation serve`, `generate`, `chat`,
`bench`, `perplexity`, a Ray replica, the desktop app (as `engine.init_from_params`) and a
server waking from sleep. Where the path comes from (a file, a starter model, the Hub) is the
caller's business: engine/hub/pull.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import os

    from .context import Context, ContextParams
    from .model import Model, ProgressFn
    from .scheduler import Scheduler
    from .vision import Projector


def init_threads(n_threads: int, warn: Callable[[str], None] | None = None) -> int:
    """-t/--threads: -1 is every core; 0 and other negatives are refused; more than the
    machine's hardware threads is cut down, and `warn` told why. Returns the count in use.

    Raises:
        EngineError: 0 or a negative other than -1.
    """
    from .errors import EngineError
    from .jit import set_num_threads

    if n_threads == 0 or n_threads < -1:
        raise EngineError(f"invalid -t/--threads {n_threads}: use 1 or more, or -1 for every core")
    n = set_num_threads(n_threads)
    if n_threads > n and warn is not None:
        warn(f"-t {n_threads} is more than the {n} hardware threads available; using {n}")
    return n


@dataclass(frozen=True)
class SchedulerParams:
    """The Scheduler's settings: slots and the server's prompt-cache and context-shift rules."""

    n_slots: int | None = None  # None: one per sequence of the context
    slot_prompt_similarity: float = 0.1
    context_shift: bool = False
    n_keep: int = 0


@dataclass(frozen=True)
class InitParams:
    """What an engine is built from (the engine's part of llama.cpp's common_params)."""

    context: ContextParams
    n_threads: int | None = None  # the numba pool's size (None: every core)
    n_gpu_layers: int = 0
    device: str | None = None
    scheduler: SchedulerParams | None = None  # None: no scheduler (generate, bench, perplexity)
    mmproj: str | None = None  # a multimodal projector to load beside the model
    image_min_tokens: int | None = None
    image_max_tokens: int | None = None


@dataclass
class Loaded:
    """A loaded engine (llama.cpp's common_init_result): the model, its context and, when asked
    for, a scheduler that is built but not started (`.start()` on a thread, `.run()` here)."""

    path: Path
    model: Model
    ctx: Context
    scheduler: Scheduler | None = None
    projector: Projector | None = None  # the mmproj, when one was given

    def close(self) -> None:
        """Give back the model's map, weights and GPU buffers (a started scheduler stops first)."""
        if self.projector is not None:
            self.projector.close()
        self.model.close()


def init_from_params(
    path: str | os.PathLike,
    params: InitParams,
    *,
    progress: ProgressFn | None = None,
    check: Callable[[Model], None] | None = None,
) -> Loaded:
    """The model at `path` loaded, with its context and (params.scheduler) its scheduler.

    Args:
        path: the .gguf file (its first part).
        params: threads, GPU offload, the context's (its decode path too) and the scheduler's
            parameters.
        progress: load_model's progress(fraction, message), then one message before the
            context's buffers are allocated.
        check: called with the loaded model before its context is built; an exception it
            raises closes the model and propagates (a waking server refuses another model).

    Raises:
        EngineError (and its subclasses): the file cannot be loaded, or the context does not
            fit; whatever the check raises.
    """
    from .context import Context
    from .model import load_model

    projector = None
    # the model is loaded for its context's decode path (the kernels it loads, the copies it makes)
    model = load_model(
        path,
        n_threads=params.n_threads,
        progress=progress,
        n_gpu_layers=params.n_gpu_layers,
        device=params.device,
        decode_path=params.context.decode_path,
    )
    try:
        if check is not None:
            check(model)
        if progress is not None:
            progress(1.0, "allocating the KV cache and compute buffers")
        projector = None
        if params.mmproj is not None:
            from .vision import load_projector

            if progress is not None:
                progress(1.0, f"loading the multimodal projector {Path(params.mmproj).name}")
            projector = load_projector(
                params.mmproj,
                model,
                image_min_tokens=params.image_min_tokens,
                image_max_tokens=params.image_max_tokens,
            )
        ctx = Context(model, params.context)
        scheduler = None
        if params.scheduler is not None:
            from .scheduler import Scheduler

            sp = params.scheduler
            scheduler = Scheduler(
                ctx,
                model.tokenizer,
                model=model,
                n_slots=sp.n_slots,
                slot_prompt_similarity=sp.slot_prompt_similarity,
                context_shift=sp.context_shift,
                n_keep=sp.n_keep,
            )
    except BaseException:
        if projector is not None:
            projector.close()
        model.close()
        raise
    return Loaded(Path(path), model, ctx, scheduler, projector)
