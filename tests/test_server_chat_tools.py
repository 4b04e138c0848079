"""/v1/chat/completions reads a reply as llama-server does when the request declares tools or
the template thinks: `tool_calls` (finish_reason "tool_calls") and `reasoning_content`, in one
reply and in the stream, over scripted replies on the fake scheduler."""

from __future__ import annotations

import json

import httpx
import pytest
from openai import OpenAI

from engine.server import start_server
from engine.server.testing import FakeChatTemplate, ScriptedHandle, make_fake_scheduler

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
    },
}
HERMES = [
    "I will check.",
    "\n<tool_",
    'call>\n{"name": "get_weather", ',
    '"arguments": {"location": "Paris"}}\n</tool_call>',
]
THINKING = ["<think>", "Paris is in", " France.</think>", "\n\nIt is sunny."]


@pytest.fixture(scope="module")
def server():
    sched = make_fake_scheduler(n_slots=2, n_ctx=1024)
    handle = start_server(sched, port=0, chat_template=FakeChatTemplate())
    yield handle
    handle.stop()
    sched.stop()


@pytest.fixture
def script(server, monkeypatch):
    def set_reply(pieces, template_source=None):
        monkeypatch.setattr(
            server.state.scheduler, "submit", lambda req: ScriptedHandle(req, list(pieces))
        )
        if template_source is not None:
            template = FakeChatTemplate()
            template.source = template_source
            monkeypatch.setattr(server.state, "chat_template", template)

    return set_reply


def chat(server, stream=False, **kw):
    body = {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "max_tokens": 8,
        "stream": stream,
        **kw,
    }
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=10)


def stream_deltas(r) -> tuple[list[dict], str]:
    deltas, finish = [], ""
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            for c in json.loads(line[6:]).get("choices", []):
                deltas.append(c["delta"])
                finish = c["finish_reason"] or finish
    return deltas, finish


def test_tool_call_in_one_reply(server, script):
    script(HERMES)
    choice = chat(server, tools=[TOOL]).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] == "I will check."
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["id"] and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"location": "Paris"}


def test_tool_call_streamed_as_deltas(server, script):
    script(HERMES)
    deltas, finish = stream_deltas(chat(server, stream=True, tools=[TOOL]))
    text = "".join(d.get("content") or "" for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert finish == "tool_calls" and text == "I will check." and "<tool_call>" not in text
    assert (
        len(calls) == 1 and calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather"
    )


def test_without_tools_or_with_tool_choice_none_the_text_is_the_answer(server, script):
    script(HERMES)
    for kw in (
        {},
        {"tools": [TOOL], "tool_choice": "none"},
        {"tools": [TOOL], "parse_tool_calls": False},
    ):
        choice = chat(server, **kw).json()["choices"][0]
        assert choice["message"]["content"] == "".join(HERMES) and choice["finish_reason"] == "stop"
        assert "tool_calls" not in choice["message"]


def test_reasoning_content_with_a_thinking_template(server, script):
    script(THINKING, template_source="{{ '<think>' }}")
    msg = chat(server).json()["choices"][0]["message"]
    assert msg == {
        "role": "assistant",
        "content": "It is sunny.",
        "reasoning_content": "Paris is in France.",
    }
    deltas, finish = stream_deltas(chat(server, stream=True))
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "Paris is in France."
    assert "".join(d.get("content") or "" for d in deltas) == "It is sunny." and finish == "stop"
    assert chat(server, reasoning_format="none").json()["choices"][0]["message"][
        "content"
    ] == "".join(THINKING)


def test_openai_sdk_reads_the_tool_call(server, script):
    script(HERMES)
    client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=[TOOL]
    )
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    chunks = list(
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], tools=[TOOL], stream=True
        )
    )
    assert any(c.choices and c.choices[0].delta.tool_calls for c in chunks)


HARMONY_TEMPLATE = "{{ '<|start|>assistant<|channel|>' }}"  # what marks a gpt-oss template
HARMONY_CALL = [
    "<|channel|>analysis<|message|>",
    "Need the ",
    "weather.<|end|>",
    "<|start|>assistant",
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
    '{"location": ',
    '"Paris"}',
]
HARMONY_ANSWER = [
    "<|channel|>analysis<|message|>",
    "Easy.",
    "<|end|><|start|>assistant<|channel|>final",
    "<|message|>",
    "It is ",
    "sunny.",
]


def test_gpt_oss_harmony_reply_is_read_with_and_without_tools(server, script):
    script(HARMONY_CALL, template_source=HARMONY_TEMPLATE)
    choice = chat(server, tools=[TOOL]).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and not choice["message"].get("content")
    assert choice["message"]["reasoning_content"] == "Need the weather."
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"location": "Paris"}
    script(HARMONY_ANSWER, template_source=HARMONY_TEMPLATE)
    msg = chat(server).json()["choices"][0]["message"]  # no tools: the channels are still markup
    assert (msg["content"], msg["reasoning_content"]) == ("It is sunny.", "Easy.")
    deltas, finish = stream_deltas(chat(server, stream=True))
    assert "".join(d.get("content") or "" for d in deltas) == "It is sunny." and finish == "stop"
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "Easy."
