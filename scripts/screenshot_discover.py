"""Offscreen screenshot of the Discover panel (Models tab) for the README: docs/screenshots/discover.png.

    QT_QPA_PLATFORM=offscreen python scripts/screenshot_discover.py [--theme light|dark] [-o PATH]

A local Hub-shaped server (tests/hub_server.py) serves the cached starter models under demo
repository names, so nothing reaches the internet; the app runs the real HubAdapter: search,
the fit read from the header by HTTP ranges, and a download (slowed down) caught half-way.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from PySide6.QtWidgets import QApplication  # noqa: E402
from qt_wait import wait_until  # noqa: E402

import hub_server  # noqa: E402
from app.engine_adapter import EngineAdapter  # noqa: E402
from app.main import build_context  # noqa: E402
from app.main_window import TAB_MODELS, MainWindow  # noqa: E402
from app.theme import apply_theme  # noqa: E402

SMOL, GEMMA = "local-demo/SmolLM2-135M-Instruct-GGUF", "local-demo/gemma-3-270m-it-GGUF"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--theme", default="light", choices=("light", "dark"))
    parser.add_argument(
        "-o", "--output", default=str(ROOT / "docs" / "screenshots" / "discover.png")
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ggstation-discover-"))
    engine = EngineAdapter()
    cached = {s.name: s.cached_path for s in engine.starter_models()}
    if not all(cached.values()):
        sys.exit(
            "run `ggstation models pull smollm2` and `ggstation models pull gemma3-270m` first"
        )
    server = hub_server.start(
        tmp,
        {
            SMOL: {"SmolLM2-135M-Instruct-Q4_1.gguf": Path(cached["smollm2"])},
            GEMMA: {"gemma-3-270m-it-Q4_K_M.gguf": Path(cached["gemma3-270m"])},
        },
    )
    server.repos[SMOL].downloads, server.repos[SMOL].likes = 1200, 31
    server.repos[GEMMA].downloads, server.repos[GEMMA].likes = 860, 12
    os.environ["HF_ENDPOINT"], os.environ["HF_HOME"] = server.url, str(tmp / "hf-home")
    app = QApplication([sys.argv[0]])
    apply_theme(app, args.theme)
    window = MainWindow(build_context(str(tmp / "data"), engine))
    window.resize(1360, 860)
    window.show()
    window.tabs.setCurrentIndex(TAB_MODELS)
    window.picker.sources.setCurrentIndex(1)
    panel = window.picker.discover
    panel.query.setText("GGUF")
    panel.search()
    wait_until(lambda: panel.repos.rowCount() == 2 and panel.files.rowCount() > 0)
    panel.repo_table.setCurrentIndex(panel.repo_table.model().index(1, 0))  # gemma: download it
    wait_until(lambda: panel.files.repo_id == GEMMA and panel.files.rowCount() > 0)
    wait_until(lambda: panel.files.fit(panel.files.file(0).filename) is not None)
    server.chunk_delay_s = 0.004  # ~15 MiB/s: half-way after a few seconds
    panel.download_selected()
    panel.repo_table.setCurrentIndex(panel.repo_table.model().index(0, 0))  # smollm2: its fit
    wait_until(lambda: panel.files.repo_id == SMOL and panel.files.rowCount() > 0)
    wait_until(lambda: panel.files.fit(panel.files.file(0).filename) is not None)
    d = panel.downloads.model.download(0)
    wait_until(lambda: d.fraction > 0.35 and d.rate > 0)
    panel.download_table.clearSelection()
    wait_until(lambda: False, 0.3)
    window.grab().save(args.output)
    print("saved", args.output)
    panel.downloads.cancel(d)
    wait_until(lambda: panel.downloads.model.rowCount() == 0, 30)
    window.close()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
