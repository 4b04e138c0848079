"""Offscreen screenshots of the app as a client of remote servers: docs/screenshots/remote-*.png.

    QT_QPA_PLATFORM=offscreen python scripts/screenshot_remote.py [-m MODEL] [--theme light|dark]

A real `ggstation serve` process (MODEL: a path or a starter model's name, default smollm2)
plays the remote llama-server-compatible machine, and tests/openai_server.py a plain
OpenAI-compatible one; nothing reaches the internet. The app runs with the test FakeEngine (no
local model) and the real remote client: the add-server dialog, the Remote servers tab, a
streamed remote chat, and the dashboard with the server's slots and throughput.
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

import openai_server  # noqa: E402
from app.dto import SamplingSettings  # noqa: E402
from app.main import build_context  # noqa: E402
from app.main_window import TAB_CHAT, TAB_MEMORY, TAB_MODELS, MainWindow  # noqa: E402
from app.theme import apply_theme  # noqa: E402
from gui.fake_engine import FakeEngine  # noqa: E402
from test_server_process import ServeProcess  # noqa: E402

OUT = ROOT / "docs" / "screenshots"
KEY = "sk-demo-key"
QUESTION = "Name three uses of a home server, in one short sentence each."


def save(widget, name: str) -> None:
    wait_until(lambda: False, 0.4)
    path = OUT / f"{name}.png"
    widget.grab().save(str(path))
    print("saved", path)


def add_server(window, url: str, key: str, name: str, shot: str = "") -> None:
    panel = window.picker.remote
    n = len(panel.servers)
    panel.add_endpoint()
    dialog = panel.dialog
    assert dialog is not None
    dialog.name_edit.setText(name)
    dialog.url_edit.setText(url)
    dialog.key_edit.setText(key)
    if shot:
        save(dialog, shot)
    dialog.accept()
    if not wait_until(lambda: len(panel.servers) > n or panel.status.objectName() == "error", 60):
        sys.exit(f"{url}: no answer")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", "--model", default="smollm2")
    parser.add_argument("--theme", default="light", choices=("light", "dark"))
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    from engine import resolve_model_arg

    server = ServeProcess(
        resolve_model_arg(args.model),
        "-np",
        "2",
        "-c",
        "4096",
        "--metrics",
        "--api-key",
        KEY,
        "--alias",
        "smollm2-135m",
    )
    plain = openai_server.start(api_key="other", models=("gpt-4o-mini", "llama-3.1-8b-instruct"))
    try:
        server.wait_ready()
        return shoot(args, server.url, plain.url)
    finally:
        plain.stop()
        server.stop()


def shoot(args, url: str, plain_url: str) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="ggstation-remote-shots-"))
    app = QApplication([sys.argv[0]])
    apply_theme(app, args.theme)
    ctx = build_context(str(tmp), FakeEngine())
    ctx.settings.sampling = SamplingSettings(temperature=0.0, seed=0, max_tokens=96)
    window = MainWindow(ctx)
    window.resize(1360, 860)
    window.show()
    window.tabs.setCurrentIndex(TAB_MODELS)
    window.picker.sources.setCurrentWidget(window.picker.remote)
    add_server(window, plain_url + "/v1", "other", "Hosted API")
    add_server(window, url, KEY, "GPU box (ggstation)", shot="remote-dialog")
    save(window, "remote-models")
    window.picker.remote.choose()
    window.chat.send(QUESTION)
    if not wait_until(lambda: not window.chat.busy(), 300):
        sys.exit("the remote reply did not finish")
    save(window, "remote-chat")
    window.tabs.setCurrentIndex(TAB_MEMORY)
    window.chat.send("And one more?")  # throughput while the dashboard is shown
    wait_until(lambda: not window.chat.busy(), 300)
    wait_until(lambda: False, 1.5)
    save(window, "remote-dashboard")
    window.tabs.setCurrentIndex(TAB_CHAT)
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
