"""Offscreen screenshots of a vision model's memory: docs/screenshots/memory-vision*.png.

    QT_QPA_PLATFORM=offscreen python scripts/screenshot_memory_vision.py [--out DIR]

The real engine (EngineAdapter) with tests/mmprojgen.py's tiny gemma3 pair, which the model list
pairs by name: the load panel's estimate with the projector's rows, then the Memory tab with the
loaded projector's weights and image encode buffer, in the light and the dark theme.
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

from app.dto import LoadParams  # noqa: E402
from app.engine_adapter import EngineAdapter  # noqa: E402
from app.main import build_context  # noqa: E402
from app.main_window import TAB_MEMORY, TAB_MODELS, MainWindow  # noqa: E402
from app.theme import apply_theme  # noqa: E402
from mmprojgen import write_tiny_vlm_pair  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ggstation-shots-"))
    model, _mmproj = write_tiny_vlm_pair(tmp / "models", "gemma3")
    app = QApplication.instance() or QApplication(sys.argv)
    apply_theme(app, "light")
    window = MainWindow(build_context(str(tmp / "data"), EngineAdapter()))
    window.resize(1280, 800)
    window.show()
    window.tabs.setCurrentIndex(TAB_MODELS)
    panel = window.picker.load_panel
    panel.set_params(LoadParams(n_ctx=1024, n_seq_max=1, n_threads=2))
    window.picker.add_paths([str(model.parent)])
    window.picker.open_path(str(model))
    if not wait_until(lambda: panel.info is not None and panel.info.mmproj != "", 60):
        sys.exit("the model was not inspected and paired")
    if not wait_until(
        lambda: any(s.label == "Projector weights" for s in panel.estimate_bar.segments), 30
    ):
        sys.exit("the estimate has no projector rows")
    wait_until(lambda: False, 0.3)
    window.grab().save(str(out / "memory-vision-estimate.png"))
    panel.start_load()
    if not wait_until(lambda: window.ctx.session is not None, 120):
        sys.exit("the model did not load")
    window.tabs.setCurrentIndex(TAB_MEMORY)
    dash = window.dashboard
    if not wait_until(lambda: dash.figures.projector_weights_bytes > 0, 10):
        sys.exit("the dashboard has no projector figures")
    wait_until(lambda: False, 1.5)  # a few polls on the timeline
    window.grab().save(str(out / "memory-vision.png"))
    apply_theme(app, "dark")
    wait_until(lambda: False, 0.5)
    window.grab().save(str(out / "memory-vision-dark.png"))
    window.close()
    window.ctx.shutdown()
    print(f"saved to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
