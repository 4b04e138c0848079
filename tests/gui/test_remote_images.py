"""Images to remote servers: a message's images go as OpenAI image_url parts (base64 data URIs)
in the places of its markers, and a server whose model reads no images says so in the reply's
bubble in words. Against real in-process `ggstation serve` servers of a tiny gemma3 pair, one
with its projector and one without (which answers 500 for images, as llama-server does)."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image
from PySide6.QtWidgets import QFileDialog

from app.dto import EndpointInfo, RemoteServerState, SamplingSettings
from app.item_models.chat_list_model import ERROR_ROLE
from app.remote_adapter import TOKENS_PER_IMAGE, RemoteChat, data_uri, openai_message
from app.vision_files import MEDIA_MARKER
from mmprojgen import write_test_image, write_tiny_vlm_pair

from .conftest import send
from .test_remote import add_server


@pytest.fixture(autouse=True)
def no_exception_escapes_a_slot(qtbot):
    with qtbot.captureExceptions() as exceptions:
        yield
    assert not exceptions, exceptions


def _png(colour=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (20, 12), colour).save(out, "PNG")
    return out.getvalue()


# the message's shape ------------------------------------------------------------------------------
def test_images_become_image_url_parts_in_marker_order():
    a, b = _png((255, 0, 0)), _png((0, 0, 255))
    m = {"role": "user", "content": MEDIA_MARKER * 2 + "What is in these?", "images": [a, b]}
    out = openai_message(m)
    assert out["role"] == "user" and "images" not in out
    assert [p["type"] for p in out["content"]] == ["image_url", "image_url", "text"]
    assert out["content"][2]["text"] == "What is in these?"
    url = out["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == b
    between = {"role": "user", "content": f"one {MEDIA_MARKER} two", "images": [a]}
    assert [p.get("text") for p in openai_message(between)["content"]] == ["one ", None, " two"]
    # text without images is left as it is, marker strings and all
    plain = {"role": "assistant", "content": f"say {MEDIA_MARKER}"}
    assert openai_message(plain) == plain
    # markers that are not one per image: the images first, the text untouched
    odd = {"role": "user", "content": f"{MEDIA_MARKER}{MEDIA_MARKER}x", "images": [a]}
    parts = openai_message(odd)["content"]
    assert [p["type"] for p in parts] == ["image_url", "text"]
    assert parts[1]["text"] == f"{MEDIA_MARKER}{MEDIA_MARKER}x"


def test_data_uri_names_the_format_by_its_bytes(tmp_path):
    jpeg = write_test_image(tmp_path / "a.jpg", 8, 8, seed=1, fmt="JPEG")
    webp = io.BytesIO()
    Image.new("RGB", (4, 4)).save(webp, "WEBP")
    assert data_uri(jpeg).startswith("data:image/jpeg;base64,")
    assert data_uri(webp.getvalue()).startswith("data:image/webp;base64,")
    assert data_uri(b"GIF89a...").startswith("data:image/gif;")
    assert data_uri(b"not an image").startswith("data:application/octet-stream;")


def test_remote_chat_counts_images_and_takes_them():
    endpoint = EndpointInfo("box", "http://127.0.0.1:9")
    chat = RemoteChat(endpoint, "", "m", RemoteServerState(url=endpoint.url, kind="openai"))
    assert chat.projector  # images can be attached: the server decides
    text = [{"role": "user", "content": "hi"}]
    two = [{"role": "user", "content": MEDIA_MARKER * 2 + "hi", "images": [b"x", b"y"]}]
    assert chat.count_tokens(two) >= chat.count_tokens(text) + 2 * TOKENS_PER_IMAGE


# real servers --------------------------------------------------------------------------------------
def _serve(directory, with_projector: bool):
    from engine.context import ContextParams
    from engine.init import InitParams, SchedulerParams, init_from_params
    from engine.server import ServerOptions, start_server
    from engine.vision import load_projector

    lm, mm = write_tiny_vlm_pair(directory, "gemma3")
    params = InitParams(
        ContextParams(n_ctx=1024, n_seq_max=1), n_threads=2, scheduler=SchedulerParams(1)
    )
    loaded = init_from_params(lm, params)
    assert loaded.scheduler is not None
    sched = loaded.scheduler.start()
    projector = load_projector(str(mm), loaded.model) if with_projector else None
    return sched, start_server(sched, port=0, options=ServerOptions(), projector=projector)


@pytest.fixture(scope="module", params=[True, False], ids=["vision", "text-only"])
def server(request, tmp_path_factory):
    sched, handle = _serve(tmp_path_factory.mktemp("remote-vlm"), request.param)
    yield request.param, handle
    handle.stop()
    sched.stop()


def test_remote_chat_sends_an_attached_image(window, qtbot, server, tmp_path, monkeypatch):
    vision, handle = server
    add_server(window, qtbot, handle.url, name="vlm box")
    panel = window.picker.remote
    qtbot.waitUntil(lambda: bool(panel.models.ids()), timeout=10_000)
    panel.model_view.setCurrentIndex(panel.models.index(0))
    panel.chat_button.click()
    pane = window.chat_pane
    assert pane.attach_button.isEnabled()
    image = tmp_path / "cat.png"
    image.write_bytes(_png())
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **kw: ([str(image)], ""))
    pane.attach_button.click()
    window.ctx.settings.sampling = SamplingSettings(max_tokens=3, seed=1)
    send(window, qtbot, "What is this?", timeout=60_000)
    reply = window.chat.chat_model.message(1)
    error = window.chat.chat_model.index(1).data(ERROR_ROLE)
    if vision:
        # the server put the image's tokens in the prompt (132 here; the question alone in the
        # chat template is under 30)
        assert not error and reply.stats["finish_reason"] == "length"
        assert reply.stats["n_prompt"] > 100
    else:
        assert "did not take the image" in error and "--mmproj" in error
        assert "image input" in error  # the server's own words follow
