"""Offscreen screenshots of images in the chat: docs/screenshots/chat-images*.png.

    QT_QPA_PLATFORM=offscreen python scripts/screenshot_images.py [--out DIR]

Uses the test FakeEngine with a fake model and an mmproj beside it (the pairing is the app's
own, so the picker shows the model as vision-capable); the pictures are drawn with Pillow.
Saves the sent message with its thumbnails and the composer with two pending attachments,
then the same with a corrupt stored image (its placeholder) in the dark theme.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from PIL import Image, ImageDraw  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402
from qt_wait import wait_until  # noqa: E402

from app.main import build_context  # noqa: E402
from app.main_window import TAB_CHAT, MainWindow  # noqa: E402
from app.theme import apply_theme  # noqa: E402
from app.vision_files import ImageAttachment  # noqa: E402


def picture(w: int, h: int, sky: tuple, sun: tuple) -> bytes:
    """A small landscape: sky, sun, hills."""
    image = Image.new("RGB", (w, h), sky)
    draw = ImageDraw.Draw(image)
    draw.ellipse((w * 0.65, h * 0.12, w * 0.85, h * 0.12 + w * 0.2), fill=sun)
    draw.polygon(
        [(0, h), (0, h * 0.6), (w * 0.35, h * 0.45), (w * 0.7, h * 0.7), (w, h * 0.55), (w, h)],
        fill=(60, 130, 70),
    )
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from gui.fake_engine import FakeEngine

    tmp = Path(tempfile.mkdtemp(prefix="ggstation-shots-"))
    folder = tmp / "models"
    folder.mkdir()
    for name in ("gemma-3-4b-it-Q4_K_M.gguf", "mmproj-gemma-3-4b-it-F16.gguf"):
        (folder / name).write_bytes(b"GGUF" + bytes(4096))
    model = str(folder / "gemma-3-4b-it-Q4_K_M.gguf")
    app = QApplication.instance() or QApplication(sys.argv)
    apply_theme(app, "light")
    engine = FakeEngine(
        reply="A green hillside under a pale blue sky, with a yellow sun in the upper right.",
        delay=0.003,
    )
    window = MainWindow(build_context(str(tmp / "data"), engine))
    window.resize(1200, 780)
    window.show()
    window.picker.add_paths([str(folder)])
    window.picker.open_path(model)
    panel = window.picker.load_panel
    if not wait_until(lambda: panel.info is not None and panel.info.path == model, 10):
        sys.exit("the model was not inspected")
    window.picker.grab().save(str(out / "models-vision.png"))
    panel.start_load()
    if not wait_until(lambda: window.ctx.session is not None, 10):
        sys.exit("the model did not load")
    window.tabs.setCurrentIndex(TAB_CHAT)
    pane = window.chat_pane
    pane.pending = [
        ImageAttachment.from_bytes(picture(320, 200, (170, 205, 235), (250, 215, 60)), "hills.png")
    ]
    pane.input.setPlainText("What is in this picture?")
    pane.submit()
    wait_until(lambda: not window.chat.busy(), 10)
    pane._attach(
        [
            ImageAttachment.from_bytes(
                picture(200, 300, (250, 190, 150), (255, 120, 40)), "dusk.png"
            ),
            ImageAttachment.from_bytes(
                picture(300, 200, (40, 50, 90), (230, 230, 230)), "night.png"
            ),
        ],
        [],
    )
    pane.input.setPlainText("And these two: which one is at night?")
    wait_until(lambda: False, 0.5)
    window.grab().save(str(out / "chat-images.png"))
    # the encoding phase, from the fake's slow "encoder", then Stop
    engine.sessions[-1].encode_s = 5.0
    pane.submit()
    model = window.chat.chat_model
    wait_until(lambda: model.rowCount() == 4 and model.row_view(3).phase != "", 5)
    wait_until(lambda: False, 0.3)
    window.grab().save(str(out / "chat-images-encoding.png"))
    window.chat.stop()
    wait_until(lambda: not window.chat.busy(), 5)
    # a stored image that no longer decodes shows a placeholder, never a crash
    broken = ImageAttachment(b"\x89PNG broken", "0" * 64, "broken.png")
    window.chat.chat_model.message(0).images.append(broken)
    window.chat.chat_model.set_messages(window.chat.chat_model.messages())
    apply_theme(app, "dark")
    wait_until(lambda: False, 0.5)
    window.grab().save(str(out / "chat-images-dark.png"))
    window.close()
    print(f"saved to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
