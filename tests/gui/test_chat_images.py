"""Images in the chat: attach (button, drop, paste), thumbnails in bubbles and history, the
model -> mmproj pairing in the picker, the text-only model's refusal, the encoding phase."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent, QGuiApplication, QImage
from PySide6.QtWidgets import QFileDialog, QStyleOptionViewItem

from app.storage import ConversationStore, Message
from app.vision_files import (
    MEDIA_MARKER,
    AttachmentError,
    ImageAttachment,
    find_mmproj,
    quant_tag,
    read_image_file,
)
from mmprojgen import write_test_image, write_tiny_vlm_pair

from .conftest import load, send
from .fake_engine import IMAGE_TOKENS


def png_bytes(w: int = 40, h: int = 30, colour=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), colour).save(out, "PNG")
    return out.getvalue()


def write_image(path: Path, **kw) -> str:
    path.write_bytes(png_bytes(**kw))
    return str(path)


def fake_gguf(path: Path) -> str:
    path.write_bytes(b"GGUF" + bytes(64))
    return str(path)


@pytest.fixture
def vlm_path(tmp_path) -> str:
    """A (fake) model with a projector beside it."""
    folder = tmp_path / "vlm"
    folder.mkdir()
    fake_gguf(folder / "mmproj-tiny-vlm-F16.gguf")
    return fake_gguf(folder / "tiny-vlm-Q4_K_M.gguf")


@pytest.fixture
def vision_window(window, qtbot, vlm_path):
    load(window, qtbot, vlm_path)
    return window


# pairing ----------------------------------------------------------------------------------------
def test_pairing_takes_the_projector_closest_to_the_models_quant(tmp_path):
    model = fake_gguf(tmp_path / "gemma-3-4b-it-Q4_K_M.gguf")
    for name in ("mmproj-F16.gguf", "mmproj-Q8_0.gguf", "mmproj-BF16.gguf"):
        fake_gguf(tmp_path / name)
    found = find_mmproj(model)
    assert Path(found.mmproj).name == "mmproj-Q8_0.gguf"  # 8 bits is closest to 4
    assert "Q4_K_M" in found.note and "mmproj-F16.gguf" in found.note  # says which, and why


def test_pairing_prefers_the_same_tag_and_reports_none(tmp_path):
    model = fake_gguf(tmp_path / "m-F16.gguf")
    fake_gguf(tmp_path / "mmproj-m-Q8_0.gguf")
    fake_gguf(tmp_path / "mmproj-m-F16.gguf")
    assert Path(find_mmproj(model).mmproj).name == "mmproj-m-F16.gguf"
    lone = tmp_path / "other"
    lone.mkdir()
    none = find_mmproj(fake_gguf(lone / "text-Q4_0.gguf"))
    assert none.mmproj == "" and "mmproj" in none.note
    assert quant_tag("x-00001-of-00003.gguf") == "" and quant_tag("a.Q5_K_S.gguf") == "Q5_K_S"


def test_picker_marks_vision_models_and_pairs_their_projector(window, qtbot, vlm_path):
    picker = window.picker
    picker.add_paths([str(Path(vlm_path).parent)])
    qtbot.waitUntil(lambda: picker.files.row_of(vlm_path) >= 0, timeout=5000)
    qtbot.wait(100)  # the folder's other files, had any been listed
    paths = [picker.files.info(r).path for r in range(picker.files.rowCount())]
    assert not any("mmproj" in p for p in paths)  # a companion, not a model
    row = picker.files.row_of(vlm_path)
    assert picker.files.index(row, 1).data() == "llama + vision"
    assert "mmproj-tiny-vlm-F16.gguf" in picker.files.index(row, 1).data(
        Qt.ItemDataRole.ToolTipRole
    )
    picker.select_path(vlm_path)
    qtbot.waitUntil(lambda: picker.load_panel.info is not None, timeout=5000)
    assert picker.load_panel.params().mmproj.endswith("mmproj-tiny-vlm-F16.gguf")


# a text-only model ------------------------------------------------------------------------------
def test_text_only_model_disables_attach_and_refuses_a_drop(loaded_window, tmp_path):
    pane = loaded_window.chat_pane
    assert not pane.attach_button.isEnabled()
    assert "mmproj" in pane.attach_button.toolTip()
    drop(pane, [write_image(tmp_path / "cat.png")])
    assert pane.pending == [] and not pane.attachments.isVisible()
    assert pane.notice.isVisible() and "cannot be attached" in pane.notice.text()


# attaching and sending --------------------------------------------------------------------------
def test_attach_by_button_and_send_puts_markers_and_bytes_in_order(
    vision_window, qtbot, tmp_path, monkeypatch
):
    w, pane = vision_window, vision_window.chat_pane
    assert pane.attach_button.isEnabled()
    a = write_image(tmp_path / "a.png", colour=(255, 0, 0))
    b = write_image(tmp_path / "b.png", colour=(0, 0, 255))
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *args, **kw: ([a, b], ""))
    pane.attach_button.click()
    assert [i.name for i in pane.pending] == ["a.png", "b.png"]
    assert pane.attachments.isVisible() and pane.attachments.count() == 2
    send(w, qtbot, "What is in these?")
    session = w.ctx.engine.sessions[-1]
    user = session.last_messages[-1]
    assert user["content"] == MEDIA_MARKER * 2 + "What is in these?"
    assert user["images"] == [Path(a).read_bytes(), Path(b).read_bytes()]
    assert w.chat.chat_model.message(1).stats["n_prompt"] >= 2 * IMAGE_TOKENS
    assert pane.pending == [] and not pane.attachments.isVisible()
    rects = thumbnail_rects(w, 0)
    assert len(rects) == 2 and all(r.height() == 96 and r.width() > 0 for r in rects)
    assert rects[0].right() < rects[1].left()


def test_drop_of_image_files_onto_the_chat_attaches_them(vision_window, tmp_path):
    pane = vision_window.chat_pane
    (tmp_path / "notes.txt").write_text("hi")
    drop(pane, [write_image(tmp_path / "x.png"), str(tmp_path / "notes.txt")])
    assert [i.name for i in pane.pending] == ["x.png"]
    assert "notes.txt is not an image" in pane.notice.text()
    with pytest.raises(AttachmentError, match="not an image"):
        read_image_file(str(tmp_path / "notes.txt"))


def test_paste_of_an_image_attaches_it_as_png(vision_window):
    pane = vision_window.chat_pane
    image = QImage(32, 16, QImage.Format.Format_RGB32)
    image.fill(Qt.GlobalColor.green)
    QGuiApplication.clipboard().setImage(image)
    pane.input.setFocus()
    pane.input.paste()
    assert [i.name for i in pane.pending] == ["pasted image.png"]
    decoded = Image.open(io.BytesIO(pane.pending[0].data))
    assert decoded.size == (32, 16) and decoded.getpixel((3, 3))[:3] == (0, 255, 0)
    assert pane.input.toPlainText() == ""  # not pasted as text
    pane.remove_attachment(0)
    assert pane.pending == [] and not pane.attachments.isVisible()


# the store --------------------------------------------------------------------------------------
def test_store_keeps_image_bytes_and_shares_them_by_sha(tmp_path):
    path = tmp_path / "h.sqlite"
    store = ConversationStore(path)
    img = ImageAttachment.from_bytes(png_bytes(), "a.png")
    c1, c2 = store.create("one"), store.create("two")
    store.add_message(c1, Message("user", "look", images=[img, img]))
    store.add_message(c2, Message("user", "again", images=[img]))
    store.close()
    store = ConversationStore(path)
    (m,) = store.messages(c1)
    assert [i.data for i in m.images] == [img.data, img.data] and m.images[0].name == "a.png"
    assert store._db.execute("SELECT COUNT(*) FROM images").fetchone()[0] == 1
    store.delete(c1)
    assert store._db.execute("SELECT COUNT(*) FROM images").fetchone()[0] == 1  # c2 shows it
    store.delete(c2)
    assert store._db.execute("SELECT COUNT(*) FROM images").fetchone()[0] == 0


def test_reopened_conversation_shows_thumbnails_and_a_corrupt_one_as_placeholder(
    make_window, qtbot, vlm_path, data_dir, tmp_path
):
    w = make_window()
    load(w, qtbot, vlm_path)
    w.chat_pane.attach_paths(
        [write_image(tmp_path / "ok.png"), write_image(tmp_path / "bad.png", colour=(0, 9, 0))]
    )
    send(w, qtbot, "two pictures")
    conversation = w.chat.conversation_id
    bad = w.chat.chat_model.message(0).images[1].sha256
    w.close()
    store = ConversationStore(Path(data_dir) / "conversations.sqlite3")
    store._db.execute("UPDATE images SET data=? WHERE sha256=?", (b"\x89PNG broken", bad))
    store._db.commit()
    store.close()
    w2 = make_window()
    w2.chat.open_conversation(conversation)
    images = w2.chat.chat_model.message(0).images
    assert len(images) == 2
    cache = w2.chat_pane.delegate.thumbnails
    assert cache.pixmap(images[0], 96) is not None and cache.pixmap(images[1], 96) is None
    assert len(thumbnail_rects(w2, 0)) == 2
    assert not w2.chat_pane.view.viewport().grab().isNull()  # painted, placeholder and all


# encoding ---------------------------------------------------------------------------------------
def test_encoding_shows_progress_and_stop_cancels_it(vision_window, qtbot, tmp_path):
    w = vision_window
    w.ctx.engine.sessions[-1].encode_s = 5.0
    w.chat_pane.attach_paths([write_image(tmp_path / "slow.png")])
    w.chat_pane.input.setPlainText("describe")
    w.chat_pane.submit()
    model = w.chat.chat_model
    qtbot.waitUntil(lambda: model.rowCount() == 2 and model.row_view(1).phase != "", timeout=5000)
    assert model.row_view(1).phase == "encoding image 1 of 1"
    with qtbot.waitSignal(w.chat.busy_changed, timeout=3000):  # well before the 5 s encode
        w.chat_pane.stop_button.click()
    assert model.message(1).stats["finish_reason"] == "stopped"
    assert model.row_view(1).phase == ""


# the real engine ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_vlm(tmp_path_factory):
    """The real adapter's session over a tiny gemma3 model and its mmproj (picked by pairing)."""
    import threading

    from app.dto import LoadParams
    from app.engine_adapter import EngineAdapter

    folder = tmp_path_factory.mktemp("vlm")
    lm, _ = write_tiny_vlm_pair(folder, "gemma3")
    pairing = find_mmproj(str(lm))
    params = LoadParams(n_ctx=256, n_seq_max=1, n_batch=64, n_ubatch=64, mmproj=pairing.mmproj)
    session = EngineAdapter().load(str(lm), params, lambda f, m: None, threading.Event())
    yield session, folder
    session.close()


def test_real_engine_counts_encodes_and_answers_an_image(real_vlm):
    from app.dto import SamplingSettings

    session, folder = real_vlm
    assert session.projector.endswith("gemma3-mmproj-f32.gguf")
    image = write_test_image(folder / "a.png", 40, 30, seed=1)
    with_image = [{"role": "user", "content": MEDIA_MARKER + "what?", "images": [image]}]
    text_only = [{"role": "user", "content": "what?"}]
    assert session.count_tokens(with_image) > session.count_tokens(text_only)
    steps = list(session.generate(with_image, SamplingSettings(max_tokens=4, seed=1)))
    assert steps[0].phase == "encoding image 1 of 1" and not steps[0].text_delta
    assert steps[-1].finish_reason == "length" and steps[-1].n_generated == 4
    assert steps[-1].n_prompt == session.count_tokens(with_image)


def test_real_engine_encodes_only_the_sent_messages_images_up_front(real_vlm):
    from app.dto import SamplingSettings

    session, folder = real_vlm
    old = write_test_image(folder / "old.png", 32, 32, seed=3)
    new = write_test_image(folder / "new.png", 48, 24, seed=4)
    history = [
        {"role": "user", "content": MEDIA_MARKER + "first", "images": [old]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": MEDIA_MARKER + "second", "images": [new]},
    ]
    steps = list(session.generate(history, SamplingSettings(max_tokens=2, seed=1)))
    assert [s.phase for s in steps if s.phase] == ["encoding image 1 of 1"]
    assert steps[-1].finish_reason == "length"  # the scheduler encoded the older image itself


def test_encode_phases_name_images_and_their_parts():
    from types import SimpleNamespace

    from app.engine_adapter import _encode_phases, _new_spans

    spans = [SimpleNamespace(id=i) for i in ("a:0", "b:0", "b:1", "c:0")]
    assert _encode_phases(spans[1:]) == [
        "encoding image 1 of 2, part 1 of 2",
        "encoding image 1 of 2, part 2 of 2",
        "encoding image 2 of 2",
    ]
    assert [s.id for s in _new_spans(spans, 2)] == ["b:0", "b:1", "c:0"]
    assert _new_spans(spans, 0) == []


def test_real_engine_cancel_before_encoding_submits_nothing(real_vlm):
    from app.dto import SamplingSettings

    session, folder = real_vlm
    image = write_test_image(folder / "b.png", 24, 24, seed=2)
    stream = session.generate(
        [{"role": "user", "content": MEDIA_MARKER, "images": [image]}], SamplingSettings()
    )
    stream.cancel()
    assert [s.finish_reason for s in stream] == ["cancelled"]


def test_real_engine_names_a_corrupt_image(real_vlm):
    from app.dto import SamplingSettings
    from engine.vision import MediaError

    session, _ = real_vlm
    broken = [{"role": "user", "content": MEDIA_MARKER + "hi", "images": [b"\x89PNG broken"]}]
    with pytest.raises(MediaError, match="failed to load image"):
        session.generate(broken, SamplingSettings())


def test_marker_is_the_engines():
    vision = pytest.importorskip("engine.vision")
    if not hasattr(vision, "MEDIA_MARKER"):
        pytest.skip("engine.vision has no MEDIA_MARKER yet")
    assert vision.MEDIA_MARKER == MEDIA_MARKER


# helpers ----------------------------------------------------------------------------------------
def drop(widget, paths: list[str]) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(p) for p in paths])
    event = QDropEvent(
        QPointF(QPoint(10, 10)),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    # offscreen Qt delivers no drop without a real drag in progress: call the handlers in the
    # order a drag would
    widget.dragEnterEvent(event)
    assert event.isAccepted()
    widget.dropEvent(event)


def thumbnail_rects(window, row: int):
    view = window.chat_pane.view
    index = window.chat.chat_model.index(row)
    option = QStyleOptionViewItem()
    option.rect = view.visualRect(index)
    option.font, option.palette, option.fontMetrics = (
        view.font(),
        view.palette(),
        view.fontMetrics(),
    )
    return window.chat_pane.delegate.thumbnail_rects(option, index)
