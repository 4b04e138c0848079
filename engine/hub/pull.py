"""The model a -m/-hf pair names, as a local path: the HF cache's copy of a Hub file (fit-checked
and downloaded first when needed), else a file path or a pulled starter model.

The library reports and the caller shows: `pull()` tells a `PullReport` what it found, the fit
estimate and the download's progress. The command line's report prints a fit table and a
progress bar (engine/commands/hub_pull.py); without one, `LogReport` logs the same milestones,
which is what a Ray replica resolving a model on its node gets.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import EngineError, HubError

if TYPE_CHECKING:
    from ..params import ModelSource
    from .client import HubFile
    from .fit import RemoteFit

log = logging.getLogger("ggstation.hub")


class PullReport(Protocol):
    """What pull() says while it works, in this order: found, fit, progress..., saved."""

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
    from . import client as hub
    from .fit import remote_fit

    report = report or LogReport()
    file = hub.resolve(spec, filename, token)
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
        EngineError: no model was given, both -m and -hf were, or the name is unknown (the
            store's error); HubError from the Hub.
    """
    if source.hf_repo is not None:
        if source.model:
            raise EngineError("use either -m/--model or -hf/--hf-repo, not both")
        return pull(
            source.hf_repo, source.hf_file, source.hf_token, n_ctx=source.n_ctx, report=report
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

    return resolve_model_arg(source.model)
