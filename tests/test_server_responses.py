"""OpenAI Responses API (/v1/responses): the openai SDK's responses.create plain and streaming,
the Responses -> chat conversion, telemetry events, input token counts and the 400s."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from engine.server import ServerOptions, start_server
from engine.server.responses import ResponsesRequest, to_chat_body
from engine.server.testing import FakeChatTemplate, make_fake_scheduler


class RecordingTemplate(FakeChatTemplate):
    """FakeChatTemplate that remembers the messages of its last render."""

    last: list[dict] = []

    def render(self, messages, add_generation_prompt=True, tools=None, **extra):
        RecordingTemplate.last = messages
        return super().render(messages, add_generation_prompt, tools, **extra)


@pytest.fixture(scope="module")
def server():
    sched = make_fake_scheduler(n_slots=2, n_ctx=512)
    handle = start_server(sched, port=0, chat_template=RecordingTemplate(), options=ServerOptions())
    yield handle
    handle.stop()
    sched.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def events(server, body: dict, path: str = "/v1/responses") -> list[tuple[str, dict]]:
    """(event name, data) of each SSE event of a streamed request."""
    r = httpx.post(server.url + path, json={**body, "stream": True}, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in r.text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines.get("event"), json.loads(lines["data"])))
    return out


def test_responses_create_with_the_openai_sdk(client):
    res = client.responses.create(
        model="gpt-4.1",
        input=[{"role": "system", "content": "Book"}, {"role": "user", "content": "best book?"}],
        max_output_tokens=4,
        temperature=0,
    )
    assert res.id.startswith("resp_") and res.object == "response" and res.status == "completed"
    assert res.output[0].id.startswith("msg_") and res.output[0].role == "assistant"
    assert res.output_text == "abcd" and res.model == "gpt-4.1"
    assert res.usage.output_tokens == 4 and res.usage.total_tokens == res.usage.input_tokens + 4
    assert RecordingTemplate.last[0] == {"role": "system", "content": "Book"}


def test_responses_stream_with_the_openai_sdk(client):
    stream = client.responses.create(
        model="m", input="hi", max_output_tokens=3, temperature=0, stream=True
    )
    seen = list(stream)
    types = [e.type for e in seen]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    msg_id = seen[2].item.id
    assert msg_id.startswith("msg_")
    deltas = [e for e in seen if e.type == "response.output_text.delta"]
    assert all(e.item_id == msg_id for e in deltas)
    done = seen[-1].response
    assert "".join(e.delta for e in deltas) == done.output_text == "abc"
    assert done.id == seen[0].response.id and done.usage.output_tokens == 3
    assert [e.sequence_number for e in seen] == list(range(1, len(seen) + 1))


def test_responses_stream_helper_accumulates(client):
    with client.responses.stream(
        model="m", input="hi", max_output_tokens=2, temperature=0
    ) as stream:
        final = stream.get_final_response()
    assert final.output_text == "ab"


def test_instructions_and_previous_items_become_chat_messages(client):
    client.responses.create(
        model="m",
        instructions="Be brief.",
        max_output_tokens=1,
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "q1"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a1"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"role": "user", "content": "q2"},
        ],
    )
    roles = [m["role"] for m in RecordingTemplate.last]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assistant = RecordingTemplate.last[2]
    assert assistant["content"] == [{"type": "text", "text": "a1"}]
    assert assistant["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert RecordingTemplate.last[3]["tool_call_id"] == "c1"


def test_to_chat_body_maps_the_responses_fields():
    body = ResponsesRequest.model_validate(
        {
            "input": "x",
            "max_output_tokens": 7,
            "top_p": 0.5,
            "reasoning": {"effort": "low"},
            "store": False,
            "tools": [{"type": "function", "name": "f", "parameters": {}}, {"type": "web_search"}],
            "tool_choice": {"type": "function", "name": "f"},
            "include": ["reasoning.encrypted_content"],
            "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
        }
    )
    chat = to_chat_body(body)
    assert chat["messages"] == [{"role": "user", "content": "x"}]
    assert chat["max_tokens"] == 7 and chat["top_p"] == 0.5 and chat["reasoning_effort"] == "low"
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {}, "strict": True}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": {"type": "object"}},
    }
    assert "include" not in chat and "input" not in chat
    items = [
        {"role": "developer", "content": "d"},
        {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "hmm"}],
        },
        {"role": "assistant", "content": "a"},
    ]
    chat = to_chat_body(ResponsesRequest.model_validate({"input": items}))
    assert chat["messages"] == [
        {"role": "developer", "content": "d"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a"}],
            "reasoning_content": "hmm",
        },
    ]


def test_stream_telemetry_progress_and_timings(server):
    seen = events(
        server,
        {
            "input": "abc " * 10,
            "max_output_tokens": 3,
            "temperature": 0,
            "timings_per_token": True,
            "return_progress": True,
        },
    )
    progress = [d for _, d in seen if "prompt_progress" in d]
    assert progress and all(d["type"] == "response.in_progress" for d in progress)
    p = progress[0]["prompt_progress"]
    assert p["total"] > 0 and p["processed"] >= p["cache"]
    assert any("timings" in d for name, d in seen if name == "response.output_text.delta")
    name, last = seen[-1]
    assert name == "response.completed" and "timings" in last and "usage" in last["response"]
    assert all(name == d["type"] for name, d in seen)


def test_without_telemetry_no_progress_or_delta_timings(server):
    seen = events(server, {"input": "hi", "max_output_tokens": 2, "temperature": 0})
    assert not any("prompt_progress" in d for _, d in seen)
    assert not any("timings" in d for n, d in seen if n == "response.output_text.delta")


def test_responses_path_without_v1_and_zero_tokens(server):
    r = httpx.post(
        server.url + "/responses", json={"input": "hi", "max_output_tokens": 0}, timeout=30
    )
    assert r.status_code == 200
    assert r.json()["output"] == [] and r.json()["usage"]["output_tokens"] == 0
    seen = events(server, {"input": "hi", "max_output_tokens": 0})
    assert [n for n, _ in seen] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]


def test_input_tokens_counts_the_rendered_prompt(server):
    r = httpx.post(server.url + "/v1/responses/input_tokens", json={"input": "hello"}, timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "response.input_tokens"
    # FakeTokenizer: BOS, then one token per byte of the rendered prompt
    assert body["input_tokens"] == 1 + len(
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    "body, words",
    [
        ({}, "input"),
        ({"input": 5}, "input"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"type": "mystery"}]}, "input[0]"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input_file",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "requires 'text'"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "call_id"),
        ({"input": []}, "empty"),
        ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
        ({"input": "x", "temperature": "hot"}, "temperature"),
        ({"input": "x", "max_output_token": 3}, "unknown field"),
    ],
)
def test_bad_requests_are_400s_naming_the_problem(server, body, words):
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


def test_sdk_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="m", input="x", previous_response_id="resp_abc")
