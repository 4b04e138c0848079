"""What the model-running commands share beyond engine/params.py: the model's path (a Hub
download shown on stderr; for serve, chat and generate with its -hf projector), the thread
count's sanity check (one clear line for -t 0 or -t 100000) and the garbage collector's pause
while `generate` and `chat` start."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
from pathlib import Path

from .. import params


def model_path(args: argparse.Namespace | params.CommonParams, n_ctx: int | None = None) -> Path:
    """The model of -m/-hf as a local path; a Hub download shows its fit table and a progress
    bar on stderr (hub_pull.ConsoleReport). `n_ctx`: the context the fit is estimated for."""
    from ..hub.pull import resolve_model_path
    from .hub_pull import ConsoleReport

    return resolve_model_path(params.model_source(args, n_ctx), ConsoleReport(sys.stderr))


def model_and_projector(
    p: params.CommonParams, n_ctx: int | None = None
) -> tuple[Path, params.CommonParams]:
    """For the commands that take images (serve, chat, generate: llama.cpp's mmproj_examples):
    model_path's model and `p` with its projector. With -hf, and neither -mm nor --no-mmproj,
    that is the repository's mmproj GGUF, downloaded beside the model (engine/hub/pull.py
    resolve_model_paths); a repository without one leaves `p.mmproj` None.

    Returns:
        (the model's Path, CommonParams with `mmproj` set when -hf brought one).
    """
    from ..hub.pull import resolve_model_paths
    from .hub_pull import ConsoleReport

    auto = p.mmproj is None and p.mmproj_auto
    found = resolve_model_paths(
        params.model_source(p, n_ctx), ConsoleReport(sys.stderr), mmproj=auto
    )
    if found.mmproj is not None:
        p = dataclasses.replace(p, mmproj=str(found.mmproj))
    return found.model, p


def init_threads(n_threads: int) -> int:
    """-t/--threads set (engine.init.init_threads), a count cut down to the machine's said on
    stderr. Returns the count in use."""
    from ..init import init_threads as init

    return init(n_threads, warn=lambda text: print(f"warning: {text}", file=sys.stderr))


_collector_paused = False


def pause_collector() -> None:
    """No garbage collection until resume_collector(): engine.cli.main calls it when the
    process's own command line is `generate` or `chat`. Importing numba and loading its
    target and kernels made ~270 collections, ~0.1 s of CPU, that found almost nothing to
    free (the peak RSS is the same without them)."""
    global _collector_paused
    gc.disable()
    _collector_paused = True


def resume_collector() -> None:
    """After the model has loaded: collect again, but leave out everything made so far
    (gc.freeze: imports, numba's registries, the tokenizer, which live as long as the
    process), so that a collection during generation does not walk them either; the ~1000
    objects start-up left in reference cycles stay until exit. Does nothing unless
    pause_collector() ran."""
    global _collector_paused
    if _collector_paused:
        _collector_paused = False
        gc.freeze()
        gc.enable()
