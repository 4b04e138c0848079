"""Embedding routes over the fake scheduler: every input shape llama-server takes, the native
and OpenAI answers, pooling 'none', and the errors (as llama-server words them, as 400s)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from engine.server import ServerOptions, start_server
from engine.server.routes_embed import embedding_prompts
from engine.server.testing import (
    BOS,
    N_SPECIAL,
    FakeChatTemplate,
    FakeTokenizer,
    make_fake_scheduler,
)

TOK = FakeTokenizer()


def _ids(text: str, bos: bool = True) -> list[int]:
    return TOK.encode(text, add_special=bos)


def _serve(pooling: str, n_batch: int = 64):
    sched = make_fake_scheduler(n_slots=2, n_ctx=512, n_batch=n_batch)
    opts = ServerOptions(embeddings=True, pooling=pooling)
    return sched, start_server(sched, port=0, options=opts, chat_template=FakeChatTemplate())


@pytest.fixture(scope="module")
def mean_server():
    sched, handle = _serve("mean")
    yield handle
    handle.stop()
    sched.stop()


@pytest.fixture(scope="module")
def none_server():
    sched, handle = _serve("none")
    yield handle
    handle.stop()
    sched.stop()


@pytest.mark.parametrize(
    "items, expected",
    [
        ("ab", [_ids("ab")]),
        ([12, 34, 56], [[12, 34, 56]]),
        (
            [12, "ab", 56],
            [[12, *_ids("ab", bos=False), 56]],
        ),  # specials only before a leading string
        (["ab", 34], [[*_ids("ab"), 34]]),
        (["ab", "cd"], [_ids("ab"), _ids("cd")]),
        (["ab", [12, 34]], [_ids("ab"), [12, 34]]),
        ([[12, 34], [12, "ab", 34]], [[12, 34], [12, *_ids("ab", bos=False), 34]]),
        ({"prompt_string": "ab"}, [_ids("ab")]),
        ({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, [_ids("ab")]),
        (
            ["x", {"prompt_string": "y"}, {"content": [{"type": "text", "text": "z"}]}],
            [_ids("x"), _ids("y"), _ids("z")],
        ),
    ],
)
def test_input_shapes(items, expected):
    assert embedding_prompts(TOK, items) == expected


@pytest.mark.parametrize(
    "items, message",
    [
        ([], "must not be empty"),
        ({"content": "string"}, "must be an array"),
        ({"content": [{"type": "unknown"}]}, "unsupported content"),
        (
            {
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                ]
            },
            "image input",
        ),
        ({"content": [{"type": "input_audio", "input_audio": {"data": "AAAA"}}]}, "audio input"),
        ({"prompt_string": "a", "multimodal_data": ["AAAA"]}, "Multimodal data"),
        ([1.5], "elements must be"),
        ({"foo": 1}, "elements must be"),
        (7, "elements must be"),
        ([[]], "empty"),
    ],
)
def test_bad_inputs_are_400(items, message):
    from engine.errors import APIError

    with pytest.raises(APIError, match=message) as e:
        embedding_prompts(TOK, items)
    assert e.value.status == 400


def test_oai_answers_one_vector_per_prompt(mean_server):
    items = ["ab", [BOS, N_SPECIAL + 1], {"prompt_string": "c"}]
    r = httpx.post(mean_server.url + "/v1/embeddings", json={"input": items})
    body = r.json()
    assert r.status_code == 200 and [d["index"] for d in body["data"]] == [0, 1, 2]
    assert body["usage"]["prompt_tokens"] == 3 + 2 + 2
    assert all(abs(np.linalg.norm(d["embedding"]) - 1) < 1e-5 for d in body["data"])


def test_content_text_parts_equal_the_string(mean_server):
    r = httpx.post(
        mean_server.url + "/v1/embeddings",
        json={
            "input": [
                "hello world",
                {
                    "content": [
                        {"type": "text", "text": "hello "},
                        {"type": "text", "text": "world"},
                    ]
                },
            ]
        },
    )
    data = r.json()["data"]
    assert data[0]["embedding"] == data[1]["embedding"]


@pytest.mark.parametrize("path", ["/embedding", "/embeddings"])
def test_native_routes_answer_a_list(mean_server, path):
    body = httpx.post(mean_server.url + path, json={"input": "ab"}).json()
    assert body[0]["index"] == 0 and len(body[0]["embedding"]) == 1  # pooled: one row


def test_content_field_asks_for_the_native_answer(mean_server):
    body = httpx.post(mean_server.url + "/v1/embeddings", json={"content": "ab"}).json()
    assert isinstance(body, list) and len(body[0]["embedding"]) == 1


def test_pooling_none_gives_one_unnormalised_vector_per_token(none_server):
    body = httpx.post(none_server.url + "/embeddings", json={"input": "abc"}).json()
    rows = body[0]["embedding"]
    assert len(rows) == len(_ids("abc"))
    assert all(abs(np.linalg.norm(row) - 1) > 1e-3 for row in rows)


def test_pooling_none_is_refused_by_the_oai_route(none_server):
    r = httpx.post(none_server.url + "/v1/embeddings", json={"input": "abc"})
    assert r.status_code == 400 and "not OAI compatible" in r.json()["error"]["message"]


def test_a_prompt_over_the_physical_batch_is_too_large(mean_server):
    r = httpx.post(mean_server.url + "/v1/embeddings", json={"input": "x" * 100})  # 101 tokens > 64
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "input (101 tokens) is too large to process. increase the physical "
        "batch size (current batch size: 64)"
    )


def test_last_pooling_may_split_a_long_prompt():
    sched, handle = _serve("last")
    try:
        r = httpx.post(handle.url + "/v1/embeddings", json={"input": "x" * 100})
        assert r.status_code == 200, r.text
    finally:
        handle.stop()
        sched.stop()


def test_no_input_is_400(mean_server):
    r = httpx.post(mean_server.url + "/v1/embeddings", json={"model": "m"})
    assert r.status_code == 400 and '"input" or "content"' in r.json()["error"]["message"]
