"""The model a -m/-hf pair names, as a local path: the HF cache's copy of a Hub file (fit-checked
and downloaded first when needed), else a file path or a pulled starter model.

With a projector asked for (the commands that take images: serve, chat, generate, as llama.cpp's
mmproj_examples), -hf also brings the repository's mmproj GGUF (`resolve_model_paths`), unless
-mm names one or --no-mmproj is given; the pick is llama.cpp's (engine/hub/siblings.py).

The library reports and the caller shows: `pull()` tells a `PullReport` what it found, the fit
estimate and the download's progress. The command line's report prints a fit table and a
progress bar (engine/commands/hub_pull.py); without one, `LogReport` logs the same milestones,
which is what a Ray replica resolving a model on its node gets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import EngineError, HubError

if TYPE_CHECKING:
    from ..params import ModelSource
    from .client import HubFile
    from .fit import RemoteFit

log = logging.getLogger("ggstation.hub")


class PullReport(Protocol):
    """What pull() says while it works, in this order: found, fit, progress..., saved; then
    for a projector downloaded with the model: found, progress..., saved (it has no fit)."""

    def found(self, file: HubFile) -> None:
        """The Hub file the spec names, not in the cache yet."""

    def fit(self, fit: RemoteFit) -> None:
        """The fit estimate from the file's header, before any download."""

    def progress(self, done: int, total: int) -> None:
        """Bytes downloaded over all parts."""

    def saved(self, path: Path | None) -> None:
        """The download ended (None: it failed); a progress display closes here."""


class LogReport:
    """A PullReport into the log: one line when a download starts and one when it ends."""

    def found(self, file: HubFile) -> None:
        log.info("%s: %s not cached, downloading (%s bytes)", file.spec, file.filename, file.size)

    def fit(self, fit: RemoteFit) -> None:
        log.info(
            "fit: %s, needs %s of %s bytes available",
            fit.verdict,
            fit.needed_bytes,
            fit.available_bytes,
        )

    def progress(self, done: int, total: int) -> None:
        pass

    def saved(self, path: Path | None) -> None:
        if path is not None:
            log.info("saved to %s", path)


@dataclass(frozen=True)
class ModelPaths:
    """A resolved model: its GGUF and the projector that goes with it (None: none asked for,
    or the repository has none)."""

    model: Path
    mmproj: Path | None = None


def pull(
    spec: str,
    filename: str | None = None,
    token: str | None = None,
    *,
    force: bool = False,
    n_ctx: int | None = None,
    report: PullReport | None = None,
) -> Path:
    """The local path of the Hub model `spec` (user/repo[:quant]) names, downloading every part
    first when the cache lacks it; an unsupported architecture or tensor type is refused
    before any download.

    Raises:
        HubError: see engine.hub.client; UNSUPPORTED when the engine cannot run the model (unless force).
    """
    return pull_paths(spec, filename, token, force=force, n_ctx=n_ctx, report=report).model


def pull_paths(
    spec: str,
    filename: str | None = None,
    token: str | None = None,
    *,
    force: bool = False,
    n_ctx: int | None = None,
    report: PullReport | None = None,
    mmproj: bool = False,
) -> ModelPaths:
    """pull(), and with `mmproj` the repository's projector for the model too (client.
    resolve_with_mmproj), downloaded after the model through the same checked download();
    none in the repository is no error.

    Raises:
        HubError: as pull().
    """
    from . import client as hub

    report = report or LogReport()
    if mmproj:
        file, projector = hub.resolve_with_mmproj(spec, filename, token)
    else:
        file, projector = hub.resolve(spec, filename, token), None
    path = _pull_model(file, token, force=force, n_ctx=n_ctx, report=report)
    if projector is None:
        return ModelPaths(path)
    if projector.local_path is not None:
        return ModelPaths(path, projector.local_path)
    report.found(projector)
    saved = None
    try:
        saved = hub.download(projector, token=token, progress=report.progress)
    finally:
        report.saved(saved)
    return ModelPaths(path, saved)


def _pull_model(
    file: HubFile, token: str | None, *, force: bool, n_ctx: int | None, report: PullReport
) -> Path:
    """`file` from the cache, else fit-checked and downloaded."""
    from . import client as hub
    from .fit import remote_fit

    if file.local_path is not None:
        return file.local_path
    report.found(file)
    fit = remote_fit(file, n_ctx=n_ctx, token=token)
    report.fit(fit)
    if not fit.supported and not force:
        raise HubError(
            f"{file.spec}: not downloaded: this engine cannot run it ({fit.why_unsupported()}); "
            "--force downloads it anyway",
            HubError.UNSUPPORTED,
        )
    path = None
    try:
        path = hub.download(file, token=token, progress=report.progress)
    finally:
        report.saved(path)
    return path


def resolve_model_path(source: ModelSource, report: PullReport | None = None) -> Path:
    """The GGUF path for -m (a file path or a starter model name) or -hf/-hff/-hft (the HF
    cache's copy, pulled first if needed).

    Raises:
        as resolve_model_paths.
    """
    return resolve_model_paths(source, report).model


def resolve_model_paths(
    source: ModelSource, report: PullReport | None = None, *, mmproj: bool = False
) -> ModelPaths:
    """resolve_model_path's model, and with `mmproj` and -hf the repository's projector
    (llama.cpp's -hf for its mmproj_examples; the caller leaves `mmproj` False when -mm names
    one or --no-mmproj is given). A -m model gets none here: llama.cpp pairs only -hf's.

    Raises:
        EngineError: no model was given, both -m and -hf were, or the name is unknown (the
            store's error); HubError from the Hub.
    """
    if source.hf_repo is not None:
        if source.model:
            raise EngineError("use either -m/--model or -hf/--hf-repo, not both")
        return pull_paths(
            source.hf_repo,
            source.hf_file,
            source.hf_token,
            n_ctx=source.n_ctx,
            report=report,
            mmproj=mmproj,
        )
    if source.hf_file:
        raise EngineError(
            "-hff/--hf-file names a file of the -hf repository: give -hf <user>/<model> too"
        )
    if not source.model:
        raise EngineError(
            "no model given: use -m/--model FNAME (a .gguf path or a starter model name) "
            "or -hf <user>/<model>[:quant]"
        )
    from .store import resolve_model_arg

    return ModelPaths(resolve_model_arg(source.model))
