"""Offscreen screenshots of the main window for the README: docs/screenshots/*.png.

    QT_QPA_PLATFORM=offscreen python scripts/screenshots.py [-m MODEL.gguf] [--fake [--gpu]] [--out DIR]

With a model (default: the cached SmolLM2 starter) the real engine runs; --fake uses the test
FakeEngine so the script works before/without the engine; --gpu adds the fake's GL0 device and
offloads 2 layers to it (the load panel's CPU / GPU estimate, the dashboard's per-device bars),
and also saves the load panel and the backends panel on their own.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from PySide6.QtWidgets import QApplication  # noqa: E402
from qt_wait import wait_until  # noqa: E402

from app.dto import LoadParams, SamplingSettings, ServerSettings  # noqa: E402
from app.machine import free_port  # noqa: E402
from app.main import build_context  # noqa: E402
from app.main_window import TAB_CHAT, TAB_MEMORY, TAB_MODELS, TAB_SERVER, MainWindow  # noqa: E402
from app.theme import apply_theme  # noqa: E402

OUT = ROOT / "docs" / "screenshots"
QUESTIONS = (
    "What is a KV cache? One short paragraph.",
    "Show a Python function that adds two numbers.",
)


def make_engine(args, tmp: Path):
    if args.fake:
        sys.path.insert(0, str(ROOT / "tests"))
        from gui.fake_engine import FAKE_CPU, FAKE_GL0, FakeEngine

        path = tmp / "tiny-llama-Q4_1.gguf"
        path.write_bytes(b"GGUF" + bytes(4096))
        devices = [FAKE_CPU, FAKE_GL0] if args.gpu else None
        return FakeEngine(delay=0.003, devices=devices), str(path)
    from app.engine_adapter import EngineAdapter

    engine = EngineAdapter()
    if args.model:  # a path or a starter model's name, as `ggstation -m` takes it
        try:
            return engine, str(Path(engine.resolve_model(args.model)).resolve())
        except Exception as e:
            sys.exit(f"-m {args.model}: {e}")
    model = next((s.cached_path for s in engine.starter_models() if s.cached_path), None)
    if not model:
        sys.exit("no model: pass -m MODEL.gguf or --fake")
    return engine, model


def shoot(window, tab: int, name: str, widget=None) -> None:
    """The window with `tab` current, or only `widget` (which that tab shows)."""
    window.tabs.setCurrentIndex(tab)
    wait_until(lambda: False, 0.3)
    (widget or window).grab().save(str(OUT / f"{name}.png"))
    print("saved", OUT / f"{name}.png")


def main() -> int:
    global OUT
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", "--model")
    parser.add_argument("--fake", action="store_true")
    parser.add_argument(
        "--gpu", action="store_true", help="with --fake: a GL0 device, 2 layers on it"
    )
    parser.add_argument("--out", help=f"folder for the PNGs (default {OUT})")
    args = parser.parse_args()
    if args.gpu and not args.fake:
        parser.error("--gpu needs --fake (the fake engine's GL0 device)")
    OUT = Path(args.out) if args.out else OUT
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ggstation-shots-"))
    app = QApplication([sys.argv[0]])
    engine, model = make_engine(args, tmp)
    ctx = build_context(str(tmp), engine)
    ctx.settings.sampling = SamplingSettings(temperature=0.0, seed=0, max_tokens=96)
    apply_theme(app, "light")
    window = MainWindow(ctx)
    window.resize(1360, 860)
    window.show()
    broken = tmp / "downloaded-page-not-a-model.gguf"  # shows how unusable files are listed
    broken.write_bytes(b"<html>404</html>" + bytes(64))
    window.picker.add_paths([str(broken)])
    # open_path selects the model once it is inspected; other files (the models folder, the
    # broken one) may be listed first, and the first listed would be selected and loaded
    window.picker.open_path(model)
    panel = window.picker.load_panel
    if not wait_until(lambda: panel.info is not None and panel.info.path == model):
        sys.exit(f"{model} was not listed")
    panel.set_params(LoadParams(n_ctx=2048, n_seq_max=2, n_gpu_layers=2 if args.gpu else 0))
    wait_until(lambda: False, 1.0)
    shoot(window, TAB_MODELS, "models")
    if args.gpu:
        shoot(window, TAB_MODELS, "load-panel", panel)
    window.picker.load_panel.start_load()
    if not wait_until(lambda: ctx.session is not None, 300):
        sys.exit("model did not load: " + window.picker.load_panel.error.text())
    if ctx.session.path != model:
        sys.exit(f"loaded {ctx.session.path}, not {model}")
    for q in QUESTIONS:
        window.chat.send(q)
        wait_until(lambda: not window.chat.busy(), 300)
    shoot(window, TAB_CHAT, "chat")
    ctx.start_server(ServerSettings("127.0.0.1", free_port()))
    wait_until(lambda: ctx.server is not None, 30)
    if ctx.server is not None:
        urllib.request.urlopen(ctx.server.url + "/v1/models", timeout=10).read()
        wait_until(lambda: False, 0.5)
    shoot(window, TAB_SERVER, "server")
    wait_until(lambda: False, 2.0)
    shoot(window, TAB_MEMORY, "memory")
    if args.gpu:
        sides = window.dashboard.side_tabs
        sides.setCurrentIndex(1)
        shoot(window, TAB_MEMORY, "memory-backends")
        shoot(window, TAB_MEMORY, "backends", sides)
        sides.setCurrentIndex(0)
    apply_theme(app, "dark")
    shoot(window, TAB_CHAT, "chat-dark")
    shoot(window, TAB_MEMORY, "memory-dark")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
