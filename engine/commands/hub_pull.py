"""The command line's side of engine/hub/pull.py: a fit table and a progress bar on stderr.

`ConsoleReport` is the PullReport every `-hf user/repo[:quant]` of a command gets; `model_path`
pulls one Hub model with it (`ggstation models pull`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO


def model_path(
    spec: str,
    filename: str | None = None,
    token: str | None = None,
    *,
    force: bool = False,
    n_ctx: int | None = None,
    out: TextIO | None = None,
) -> Path:
    """The local path of the model `spec` names, downloading it (all parts) if needed, with
    its fit table and a progress bar on `out` (default: stderr).

    Raises:
        HubError: see engine.hub.pull.pull.
    """
    from ..hub.pull import pull

    return pull(
        spec, filename, token, force=force, n_ctx=n_ctx, report=ConsoleReport(out or sys.stderr)
    )


class ConsoleReport:
    """A PullReport (engine/hub/pull.py) for a terminal: the file and its fit estimate, a
    progress bar while it downloads, where it was saved."""

    def __init__(self, out: TextIO):
        self.out = out
        self.spec = self.filename = ""
        self.bar: ProgressBar | None = None

    def found(self, file) -> None:
        self.spec, self.filename = file.spec, file.filename
        self.bar = None  # a projector after its model: a bar of its own
        print(f"{file.spec}: {file.filename}{_parts(file)}, {_size(file.size)}", file=self.out)

    def fit(self, fit) -> None:
        print_fit(fit, self.out)
        self.bar = ProgressBar(self.filename, self.out)  # its clock starts as the download does

    def progress(self, done: int, total: int) -> None:
        if self.bar is None:  # no fit came first (a projector): the download starts now
            self.bar = ProgressBar(self.filename, self.out)
        self.bar(done, total)

    def saved(self, path: Path | None) -> None:
        if self.bar is not None:
            self.bar.close()
        if path is not None:
            print(f"{self.spec}: saved to {path}", file=self.out)


def print_fit(fit, out: TextIO) -> None:
    """The fit estimate as a few `key  value` lines."""
    types = ", ".join(
        f"{k} {_size(v)}" for k, v in sorted(fit.quant_bytes.items(), key=lambda kv: -kv[1])
    )
    rows = [
        (
            "architecture",
            f"{fit.arch or '?'}" + ("" if fit.arch_supported else " (not supported here)"),
        ),
        (
            "parameters",
            f"{fit.n_params / 1e6:.1f} M" if fit.n_params < 1e9 else f"{fit.n_params / 1e9:.2f} B",
        ),
        ("context (train)", str(fit.n_ctx_train)),
        ("chat template", "yes" if fit.has_chat_template else "no"),
        (
            "tensor types",
            types
            + (
                f" (not supported: {', '.join(fit.unsupported_types)})"
                if fit.unsupported_types
                else ""
            ),
        ),
    ]
    if fit.error and fit.arch_supported and not fit.unsupported_types:
        rows.append(("cannot load", fit.error))
    mem = (
        ""
        if fit.memory is None
        else f" at n_ctx {fit.n_ctx} (weights {_size(fit.memory.weights_bytes)}, "
        f"KV {_size(fit.memory.kv_bytes)}, compute {_size(fit.memory.compute_bytes)})"
    )
    rows.append(
        (
            "memory",
            f"{_size(fit.needed_bytes)}{mem}; {_size(fit.available_bytes)} available: "
            f"{fit.verdict.upper()}",
        )
    )
    rows.append(
        ("read", f"{_size(fit.bytes_read)} of {_size(fit.file_size)} in {fit.seconds:.2f} s")
    )
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}", file=out)


class ProgressBar:
    """progress(done, total) as one updating line on a terminal, a line per 10 % otherwise."""

    def __init__(self, name: str, out: TextIO):
        self.name = name if len(name) <= 40 else "…" + name[-39:]
        self.out = out
        self.tty = out.isatty()
        self.t0 = time.monotonic()
        self.start_bytes: int | None = None
        self.last_draw = 0.0
        self.last_decile = -1

    def __call__(self, done: int, total: int) -> None:
        if self.start_bytes is None:
            self.start_bytes = done
        now = time.monotonic()
        pct = 100 * done // max(total, 1)
        speed = (done - self.start_bytes) / max(now - self.t0, 1e-6)
        text = f"{self.name} {pct:3d}% {_size(done)} / {_size(total)} {speed / 2**20:6.1f} MiB/s"
        if self.tty:
            if now - self.last_draw >= 0.1 or done >= total:
                self.last_draw = now
                print(f"\r\033[K{text}", end="", file=self.out, flush=True)
        elif pct // 10 != self.last_decile:
            self.last_decile = pct // 10
            print(text, file=self.out, flush=True)

    def close(self) -> None:
        if self.tty and self.last_draw:
            print(file=self.out)


def _parts(file) -> str:
    return f" (+{len(file.parts) - 1} more parts)" if file.is_split else ""


def _size(n: int | None) -> str:
    if n is None:
        return "? MiB"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
