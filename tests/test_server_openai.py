"""The official openai SDK against the server (fake scheduler): the shapes real clients parse."""

from __future__ import annotations

import openai
import pytest

from engine.server import ServerOptions, start_server
from engine.server.testing import FakeChatTemplate, make_fake_scheduler


@pytest.fixture(scope="module")
def client():
    sched = make_fake_scheduler(n_slots=2, n_ctx=512)
    handle = start_server(
        sched,
        port=0,
        api_keys=["sk-test"],
        chat_template=FakeChatTemplate(),
        options=ServerOptions(embeddings=True),
    )
    yield openai.OpenAI(base_url=handle.url + "/v1", api_key="sk-test", max_retries=0)
    handle.stop()
    sched.stop()


def test_openai_sdk_chat(client):
    r = client.chat.completions.create(
        model="anything",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
        seed=1,
    )
    assert r.choices[0].message.content == "abcd"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 4 and r.model == "anything"


def test_openai_sdk_chat_stream(client):
    stream = client.chat.completions.create(
        model="x",
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
        max_completion_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "abc"
    assert chunks[-1].usage.completion_tokens == 3


def test_openai_sdk_completions_and_embeddings(client):
    r = client.completions.create(model="x", prompt="abc", max_tokens=2, temperature=0)
    assert r.choices[0].text == "de"
    e = client.embeddings.create(model="x", input=["a", "b"])
    assert len(e.data) == 2 and len(e.data[0].embedding) == 8
    assert [m.id for m in client.models.list()] == ["fake-model.gguf"]


def test_openai_sdk_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[], max_tokens=1)
    assert e.value.status_code == 400
    bad = openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
