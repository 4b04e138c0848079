"""Figures for the Hub path over the local Hub-shaped server (tests/hub_server.py): the time to
a fit estimate of each starter model and the bytes it read, and download throughput of
engine/hub/client.py against curl and huggingface_hub's own hf_hub_download on the same file.

    python tests/bench_hub.py            # needs the starter models (ggstation models pull ...)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hub_server  # noqa: E402
from engine.hub import store as model_store


def main() -> int:
    names = [n for n in ("smollm2", "gemma3-270m") if model_store.cached_path(n)]
    if not names:
        print("no starter model pulled: run `ggstation models pull smollm2`")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-hub-"))
    repos = {
        f"starter/{n}-GGUF": {model_store.resolve(n).filename: model_store.cached_path(n)}
        for n in names
    }
    server = hub_server.start(tmp, repos)
    os.environ.update(HF_ENDPOINT=server.url, HF_HOME=str(tmp / "hf"), HF_HUB_DISABLE_TELEMETRY="1")
    from engine.hub import client as hub
    from engine.hub.fit import remote_fit

    try:
        for n in names:
            repo_id = f"starter/{n}-GGUF"
            t0 = time.perf_counter()
            f = hub.resolve(repo_id)
            t_resolve = time.perf_counter() - t0
            fit = remote_fit(f)
            t_fit = time.perf_counter() - t0
            print(
                f"{n}: resolve {t_resolve * 1e3:.0f} ms, fit estimate after {t_fit * 1e3:.0f} ms "
                f"(fit alone {fit.seconds * 1e3:.0f} ms); read {fit.bytes_read / 2**20:.1f} MiB of "
                f"{f.size / 2**20:.1f} MiB ({100 * fit.bytes_read / f.size:.1f} %); {fit.summary()}"
            )
            t0 = time.perf_counter()
            warm = remote_fit(hub.resolve(repo_id))
            print(
                f"  again, modules loaded: resolve + fit {(time.perf_counter() - t0) * 1e3:.0f} ms "
                f"(fit {warm.seconds * 1e3:.0f} ms)"
            )
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-m", "engine", "models", "fit", repo_id],
                capture_output=True,
                text=True,
                env=os.environ,
            )
            print(
                f"  `ggstation models fit {repo_id}`: {time.perf_counter() - t0:.2f} s wall (rc {out.returncode})"
            )
        n = names[0]
        f = hub.resolve(f"starter/{n}-GGUF")
        size = f.size or 0
        for label, run in (
            ("engine/hub/client.py download", lambda: hub.download(f)),
            ("huggingface_hub hf_hub_download", lambda: _hf_download(f)),
            ("curl", lambda: _curl(server.url, f)),
        ):
            best = min(_timed(run, tmp) for _ in range(3))
            print(
                f"{label}: {size / best / 2**20:.0f} MiB/s ({size / 2**20:.0f} MiB in {best:.2f} s, best of 3)"
            )
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _timed(run, tmp: Path) -> float:
    shutil.rmtree(tmp / "hf", ignore_errors=True)
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def _hf_download(f) -> None:
    from huggingface_hub import hf_hub_download

    hf_hub_download(
        f.repo_id,
        f.filename,
        endpoint=os.environ["HF_ENDPOINT"],
        cache_dir=Path(os.environ["HF_HOME"]) / "hub",
    )


def _curl(base: str, f) -> None:
    dest = Path(os.environ["HF_HOME"]) / "curl.gguf"
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["curl", "-sSfL", "-o", str(dest), f"{base}/{f.repo_id}/resolve/{f.revision}/{f.filename}"],
        check=True,
    )


if __name__ == "__main__":
    sys.exit(main())
