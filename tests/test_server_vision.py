"""Images through the HTTP server, as llama-server takes them (tools/server/tests/unit/
test_vision_api.py is the model): OpenAI image_url parts (data URI, raw base64, http, file://
under --media-path), Anthropic image blocks, the Responses API's input_image, /completion's
multimodal_data; the errors (no projector, bad bytes, marker count, context) and the prompt
cache over a repeated image. Tiny LM + mmproj pairs (tests/mmprojgen.py), one per projector."""

from __future__ import annotations

import base64
import http.server
import os
import threading
from pathlib import Path

import httpx
import openai
import pytest

from engine.server import ServerOptions, start_server
from engine.server import media as server_media
from engine.server.errors import APIError
from engine.server.testing import FakeChatTemplate, make_fake_scheduler
from mmprojgen import write_test_image, write_tiny_vlm_pair

PNG = write_test_image(None, 40, 30, seed=1)
PNG2 = write_test_image(None, 24, 36, seed=2)
JPEG = write_test_image(None, 33, 20, seed=3, fmt="JPEG")


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def chat_body(*parts: dict, **extra) -> dict:
    return {
        "messages": [{"role": "user", "content": list(parts)}],
        "max_tokens": 2,
        "temperature": 0,
        **extra,
    }


# -- where image bytes come from (no model) ---------------------------------------------------


def test_marker_is_llama_cpps_and_the_projectors():
    from engine.vision import MEDIA_MARKER

    assert server_media.MEDIA_MARKER == MEDIA_MARKER == "<__media__>"


@pytest.mark.parametrize(
    "url,expect",
    [
        (data_uri(b"\x89PNG..."), b"\x89PNG..."),
        ("data:image/jpeg;base64," + base64.b64encode(b"abc").decode(), b"abc"),
        (base64.b64encode(b"raw bytes").decode(), b"raw bytes"),
        (base64.b64encode(b"no pad!").decode().rstrip("="), b"no pad!"),
    ],
)
def test_load_media_decodes_base64_forms(url, expect):
    assert server_media.load_media(url, None) == expect


@pytest.mark.parametrize(
    "url,status,words",
    [
        ("data:text/html;base64,aGVsbG8=", 400, "Invalid uri format"),
        ("data:image/png,aGVsbG8=", 400, "base64 encoded"),
        ("data:image/png;base64,a,b", 400, "Invalid uri-encoded"),
        ("malformed!", 400, "Invalid base64"),
        ("", 400, "Invalid base64"),
        ("file://x.png", 400, "--media-path"),
        ("http://127.0.0.1:9/x.png", 500, "Failed to download image"),  # nothing listens on 9
    ],
)
def test_load_media_errors(url, status, words):
    with pytest.raises(APIError) as e:
        server_media.load_media(url, None)
    assert e.value.status == status and words in str(e.value)


def test_file_urls_stay_inside_media_path(tmp_path):
    media = tmp_path / "media"
    (media / "sub").mkdir(parents=True)
    (media / "sub" / "a.png").write_bytes(PNG)
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"secret")
    os.symlink(secret, media / "link.png")
    os.symlink(media / "sub" / "a.png", media / "inner.png")
    root = str(media)
    assert server_media.load_media("file://sub/a.png", root) == PNG
    assert server_media.load_media("file://inner.png", root) == PNG  # a link that stays inside
    for rel in ("../secret.png", "sub/../../secret.png", str(secret), "link.png", "sub//a.png"):
        with pytest.raises(APIError) as e:
            server_media.load_media("file://" + rel, root)
        assert e.value.status == 400 and "not allowed" in str(e.value), rel
    with pytest.raises(APIError, match="does not exist"):
        server_media.load_media("file://missing.png", root)


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/a.png":
            body, status = PNG, 200
        elif self.path == "/text":
            body, status = b"<html>hello</html>", 200
        elif self.path == "/big":
            body, status = b"\0" * (server_media.MAX_DOWNLOAD_BYTES + 1), 200
        else:
            body, status = b"not here", 404
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_host():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_download(image_host):
    assert server_media.load_media(image_host + "/a.png", None) == PNG
    for path, words in (("/404", "HTTP 404"), ("/big", "larger than")):
        with pytest.raises(APIError) as e:
            server_media.load_media(image_host + path, None)
        assert e.value.status == 500 and "Failed to download image" in str(e.value)
        assert words in str(e.value)


# -- a text-only server -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_server():
    sched = make_fake_scheduler(n_slots=2, n_ctx=512)
    handle = start_server(sched, port=0, chat_template=FakeChatTemplate(), options=ServerOptions())
    yield handle
    handle.stop()
    sched.stop()


def test_text_only_server_refuses_media_as_llama_server(text_server):
    url = text_server.url
    props = httpx.get(url + "/props").json()
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    assert "multimodal" not in httpx.get(url + "/v1/models").json()["models"][0]["capabilities"]
    cases = [
        ("/v1/chat/completions", chat_body(image_part(data_uri(PNG))), 500, "image input"),
        (
            "/v1/chat/completions",
            chat_body({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
            500,
            "audio input is not supported",
        ),
        ("/v1/chat/completions", chat_body({"type": "video", "x": 1}), 400, "content[].type"),
        (
            "/v1/messages",
            {
                "max_tokens": 2,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "url", "url": "http://127.0.0.1:9/x.png"},
                            }
                        ],
                    }
                ],
            },
            500,
            "image input",
        ),
        (
            "/v1/responses",
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            500,
            "image input",
        ),
        (
            "/completion",
            {"prompt": {"prompt_string": "a <__media__>", "multimodal_data": ["AAAA"]}},
            400,
            "Multimodal data provided",
        ),
    ]
    for path, body, status, words in cases:
        r = httpx.post(url + path, json=body)
        assert r.status_code == status and words in r.json()["error"]["message"], (path, r.text)
    # the server still answers
    assert httpx.post(url + "/completion", json={"prompt": "ab", "n_predict": 1}).status_code == 200


# -- with a projector -------------------------------------------------------------------------


def serve_pair(
    directory: Path,
    projector: str,
    n_ctx: int = 2048,
    media_path: str | None = None,
    embeddings: bool = False,
):
    """A tiny pair loaded and served as the desktop app serves its model: the scheduler and
    the projector handed to start_server."""
    from engine.context import ContextParams
    from engine.init import InitParams, SchedulerParams, init_from_params
    from engine.vision import load_projector

    lm, mm = write_tiny_vlm_pair(directory, projector)
    params = InitParams(
        ContextParams(n_ctx=n_ctx, n_seq_max=2), n_threads=2, scheduler=SchedulerParams(2)
    )
    loaded = init_from_params(lm, params)
    assert loaded.scheduler is not None
    sched = loaded.scheduler.start()
    handle = start_server(
        sched,
        port=0,
        options=ServerOptions(media_path=media_path, embeddings=embeddings),
        projector=load_projector(str(mm), loaded.model),
    )
    return sched, handle


@pytest.fixture(scope="module", params=["gemma3", "idefics3", "mlp"])
def vlm(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    (directory / "media").mkdir()
    (directory / "media" / "a.png").write_bytes(PNG)
    sched, handle = serve_pair(directory, request.param, media_path=str(directory / "media"))
    yield handle
    handle.stop()
    sched.stop()


@pytest.fixture(scope="module")
def client(vlm):
    return openai.OpenAI(base_url=vlm.url + "/v1", api_key="x", max_retries=0)


def test_models_and_props_say_vision(vlm):
    caps = httpx.get(vlm.url + "/v1/models").json()["models"][0]["capabilities"]
    assert "completion" in caps and "multimodal" in caps
    props = httpx.get(vlm.url + "/props").json()
    assert props["modalities"]["vision"] is True and props["media_marker"] == "<__media__>"


def test_chat_with_an_image_and_the_cache(client):
    def ask():
        return client.chat.completions.create(
            model="x",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this:"},
                        {"type": "image_url", "image_url": {"url": data_uri(PNG)}},
                    ],
                }
            ],
            max_tokens=3,
            temperature=0,
        )

    first = ask()
    assert first.choices[0].message.role == "assistant"
    assert first.usage.completion_tokens >= 1
    second = ask()
    assert second.choices[0].message.content == first.choices[0].message.content
    # the same image: its placeholder ids match, so the cached prefix runs through it (all
    # but the last prompt token, which is evaluated again for its logits)
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1
    text_only = client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "What is this:"}],
        max_tokens=1,
        temperature=0,
    )
    assert first.usage.prompt_tokens > text_only.usage.prompt_tokens + 4  # the image's tokens


def test_streamed_chat_with_an_image_and_two_choices(client):
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": data_uri(PNG2)}},
                {"type": "text", "text": "Describe it."},
            ],
        }
    ]
    plain = client.chat.completions.create(
        model="x", messages=messages, max_tokens=3, temperature=0, n=2
    )
    assert len(plain.choices) == 2
    assert plain.choices[0].message.content == plain.choices[1].message.content  # greedy
    chunks = list(
        client.chat.completions.create(
            model="x", messages=messages, max_tokens=3, temperature=0, stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content


def test_image_forms_agree(vlm, image_host):
    """data URI, raw base64, file:// and http give the same prompt for the same bytes."""
    counts = set()
    for url in (
        data_uri(PNG),
        base64.b64encode(PNG).decode(),
        "file://a.png",
        image_host + "/a.png",
    ):
        r = httpx.post(
            vlm.url + "/v1/chat/completions/input_tokens",
            json=chat_body({"type": "text", "text": "x"}, image_part(url)),
        )
        assert r.status_code == 200, (url[:30], r.text)
        counts.add(r.json()["input_tokens"])
    assert len(counts) == 1


def test_two_images_in_order(vlm):
    one = httpx.post(
        vlm.url + "/v1/chat/completions", json=chat_body(image_part(data_uri(PNG)))
    ).json()
    two = httpx.post(
        vlm.url + "/v1/chat/completions",
        json=chat_body(
            image_part(data_uri(PNG)),
            {"type": "text", "text": "and"},
            image_part(data_uri(JPEG, "image/jpeg")),
        ),
    ).json()
    assert two["usage"]["prompt_tokens"] > one["usage"]["prompt_tokens"]


def test_remote_images_that_fail(vlm, image_host):
    """test_vision_api.py's cases: a 404 and a page that is not an image are errors."""
    for path, status in (("/404", 500), ("/page.html", 500)):
        r = httpx.post(
            vlm.url + "/v1/chat/completions", json=chat_body(image_part(image_host + path))
        )
        assert r.status_code == status, r.text
    r = httpx.post(
        vlm.url + "/v1/chat/completions", json=chat_body(image_part(image_host + "/text"))
    )
    assert r.status_code == 400 and "image" in r.json()["error"]["message"]
    r = httpx.post(
        vlm.url + "/completion",
        json={"prompt": {"prompt_string": "What is this:\n", "multimodal_data": [""]}},
    )
    assert r.status_code == 400


def test_completion_multimodal_data(vlm):
    body = {
        "prompt": {
            "prompt_string": "What is this: <__media__>\n",
            "multimodal_data": [base64.b64encode(PNG2).decode()],
        },
        "n_predict": 2,
        "temperature": 0,
    }
    r = httpx.post(vlm.url + "/completion", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["tokens_evaluated"] > 10
    again = httpx.post(vlm.url + "/completion", json=body).json()
    assert again["tokens_cached"] > 0 and again["content"] == r.json()["content"]


def test_anthropic_and_responses_images(vlm):
    a = httpx.post(
        vlm.url + "/v1/messages",
        json={
            "max_tokens": 2,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": base64.b64encode(PNG).decode(),
                            },
                        },
                    ],
                }
            ],
        },
    )
    assert a.status_code == 200, a.text
    assert a.json()["usage"]["input_tokens"] > 10
    r = httpx.post(
        vlm.url + "/v1/responses",
        json={
            "max_output_tokens": 2,
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": data_uri(PNG)},
                    ],
                }
            ],
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] > 10


@pytest.mark.parametrize(
    "body,status,words",
    [
        (chat_body(image_part(data_uri(b"not an image"))), 400, ""),
        (chat_body(image_part("data:text/html;base64,aGVsbG8=")), 400, "Invalid uri format"),
        (chat_body(image_part("file://../etc/passwd")), 400, "not allowed"),
        (chat_body({"type": "text", "text": "a <__media__> b"}), 400, "media markers"),
        (
            {
                "prompt": {"prompt_string": "no marker", "multimodal_data": [data_uri(PNG)[22:]]},
                "n_predict": 1,
            },
            400,
            "media markers",
        ),
        (
            {
                "prompt": {"prompt_string": "<__media__>", "multimodal_data": ["malformed"]},
                "n_predict": 1,
            },
            400,
            "",
        ),
        (
            chat_body({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
            500,
            "audio input is not supported",
        ),
    ],
)
def test_bad_images_are_errors_and_the_server_goes_on(vlm, body, status, words):
    path = "/completion" if "prompt" in body else "/v1/chat/completions"
    r = httpx.post(vlm.url + path, json=body)
    assert r.status_code == status and words in r.json()["error"]["message"], r.text
    ok = httpx.post(vlm.url + "/v1/chat/completions", json=chat_body(image_part(data_uri(PNG))))
    assert ok.status_code == 200


def test_image_larger_than_the_context(tmp_path):
    sched, handle = serve_pair(tmp_path, "gemma3", n_ctx=64)
    try:
        r = httpx.post(
            handle.url + "/v1/chat/completions", json=chat_body(image_part(data_uri(PNG)))
        )
        assert r.status_code == 400 and "context" in r.json()["error"]["message"], r.text
        r = httpx.post(handle.url + "/completion", json={"prompt": "ab", "n_predict": 1})
        assert r.status_code == 200  # the slot was freed
    finally:
        handle.stop()
        sched.stop()


def test_embeddings_with_images(tmp_path):
    """/embeddings takes images as llama-server does: an OpenAI content array with image_url
    parts, or a prompt object with multimodal_data; the image changes the vector, the same
    image gives the same vector, and a corrupt one is a 400 that leaves the server serving."""
    sched, handle = serve_pair(tmp_path, "mlp", n_ctx=256, embeddings=True)
    other = write_test_image(None, 30, 20, 9)
    try:
        vecs = []
        for body in (
            {"input": [{"content": [{"type": "text", "text": "a"}, image_part(data_uri(PNG))]}]},
            {
                "input": [
                    {
                        "prompt_string": "a<__media__>",
                        "multimodal_data": [base64.b64encode(PNG).decode()],
                    }
                ]
            },
            {"input": [{"content": [{"type": "text", "text": "a"}, image_part(data_uri(other))]}]},
        ):
            r = httpx.post(handle.url + "/v1/embeddings", json=body)
            assert r.status_code == 200, r.text
            vecs.append(r.json()["data"][0]["embedding"])
            assert r.json()["usage"]["prompt_tokens"] > 16  # the image's 16 tokens count
        assert vecs[0] == pytest.approx(vecs[1], abs=1e-6)  # the same image, two request forms
        assert max(abs(x - y) for x, y in zip(vecs[0], vecs[2], strict=True)) > 1e-4
        bad = {"input": [{"content": [image_part("data:image/png;base64,AAAA")]}]}
        r = httpx.post(handle.url + "/v1/embeddings", json=bad)
        assert r.status_code == 400
        r = httpx.post(handle.url + "/v1/embeddings", json={"input": "a"})
        assert r.status_code == 200 and len(r.json()["data"]) == 1
    finally:
        handle.stop()
        sched.stop()


def test_serve_flags_load_the_projector(tmp_path):
    """`serve -m LM -mm MMPROJ --media-path DIR`: the flags, startup's load, a listener."""
    from engine import params
    from engine.server import flags, startup
    from engine.server.http import listen
    from engine.server.state import ServerState

    lm, mm = write_tiny_vlm_pair(tmp_path, "gemma3")
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "a.png").write_bytes(PNG)
    argv = ["-m", str(lm), "-mm", str(mm), "-c", "512", "-np", "1"]
    args = flags.parse_serve_args([*argv, "--media-path", str(tmp_path / "media")])
    assert not args.ignored
    p = params.common_params(args)
    state = ServerState(startup.server_options(args, p))
    sched = startup.load(args, p, state, Path(lm), 2).start()
    handle = listen(state, "127.0.0.1", 0, app=startup.build_app(state))
    try:
        assert state.projector is not None and state.projector.projector_type == "gemma3"
        r = httpx.post(
            handle.url + "/v1/chat/completions", json=chat_body(image_part("file://a.png"))
        )
        assert r.status_code == 200, r.text
    finally:
        handle.stop()
        sched.stop()
    with pytest.raises(SystemExit):  # llama-server: "not a directory"
        flags.parse_serve_args([*argv, "--media-path", str(tmp_path / "nope")])
    # --no-mmproj wins over -mm, as in llama.cpp
    args = flags.parse_serve_args([*argv, "--no-mmproj"])
    assert params.init_params(params.common_params(args), 1).mmproj is None
