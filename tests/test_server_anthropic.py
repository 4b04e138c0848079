"""Anthropic Messages API over the fake scheduler: body conversion, response and stream
shapes, token counting, errors; scripted replies for tool use and thinking."""

from __future__ import annotations

import json

import httpx
import pytest

from engine.sequence import GenerationStep
from engine.server import start_server
from engine.server.anthropic import CountTokensRequest, MessagesRequest, to_chat
from engine.server.testing import FakeChatTemplate, ScriptedHandle, make_fake_scheduler

WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def server():
    sched = make_fake_scheduler(n_slots=2, n_ctx=1024)
    handle = start_server(sched, port=0, chat_template=FakeChatTemplate())
    yield handle
    handle.stop()
    sched.stop()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def ask(content="hi", **kw):
    return {
        "model": "claude-x",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": content}],
        **kw,
    }


def events(text: str) -> list[tuple[str, dict]]:
    """(event name, data) pairs of an SSE body; each data's "type" must name its event."""
    out = []
    for chunk in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"] or lines["event"] == "error"
        out.append((lines["event"], data))
    return out


# -- conversion -------------------------------------------------------------------------------


def convert(body: dict, cls=MessagesRequest) -> dict:
    return to_chat(cls.model_validate(body)).model_dump(exclude_none=True)


def test_system_blocks_join_and_lead():
    chat = convert(
        ask(
            system=[{"type": "text", "text": "A"}, {"type": "image"}, {"type": "text", "text": "B"}]
        )
    )
    assert chat["messages"][0] == {"role": "system", "content": "AB"}
    assert convert(ask(system="S"))["messages"][0] == {"role": "system", "content": "S"}


def test_billing_stamp_is_blanked():
    stamp = "x-anthropic-billing-header: cc_version=2.1; cch=a5145;You are Claude"
    assert convert(ask(system=stamp))["messages"][0]["content"] == (
        "x-anthropic-billing-header: cc_version=2.1; cch=fffff;You are Claude"
    )


def test_tool_use_and_results_become_tool_calls_and_tool_messages():
    body = {
        "max_tokens": 5,
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Look it up.", "signature": "sig"},
                    {"type": "text", "text": "Checking"},
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "get_weather",
                        "input": {"location": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Results:"},
                    {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "is_error": True,
                        "content": [
                            {"type": "text", "text": "not "},
                            {"type": "text", "text": "found"},
                        ],
                    },
                    {"type": "tool_result", "tool_use_id": "t3"},
                ],
            },
        ],
    }
    m = convert(body)["messages"]
    assistant = m[1]
    assert assistant["content"] == [{"type": "text", "text": "Checking"}]
    assert assistant["reasoning_content"] == "Look it up."
    call = assistant["tool_calls"][0]
    assert call["id"] == "t1" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"location": "Paris"}
    assert m[2] == {"role": "user", "content": [{"type": "text", "text": "Results:"}]}
    assert m[3:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "t2", "content": "not found"},
        {"role": "tool", "tool_call_id": "t3", "content": ""},
    ]


def test_a_message_of_only_tool_results_leaves_only_tool_messages():
    m = convert(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "a", "content": "x"}],
                }
            ]
        },
        CountTokensRequest,
    )["messages"]
    assert m == [{"role": "tool", "tool_call_id": "a", "content": "x"}]


def test_assistant_tool_use_alone_has_empty_content():
    m = convert(ask(), MessagesRequest)["messages"]
    assert m == [{"role": "user", "content": "hi"}]
    body = {
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "i", "name": "f"}]},
            {"role": "assistant"},
            {"role": "user", "content": [{"type": "document"}]},
        ]
    }
    m = convert(body, CountTokensRequest)["messages"]
    assert m == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "i", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        }
    ]


def test_tools_and_options_map_to_chat_fields():
    chat = convert(
        ask(
            tools=[WEATHER],
            tool_choice={"type": "any"},
            stop_sequences=["END"],
            temperature=0.5,
            top_p=0.9,
            top_k=7,
            stream=True,
            metadata={"user_id": "u"},
            thinking={"type": "enabled", "budget_tokens": 50},
            chat_template_kwargs={"a": 1},
            container="ignored",
            service_tier="auto",
        )
    )
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": WEATHER["input_schema"],
            },
        }
    ]
    assert chat["tool_choice"] == "required"
    assert (chat["stop"], chat["temperature"], chat["top_p"], chat["top_k"], chat["stream"]) == (
        ["END"],
        0.5,
        0.9,
        7,
        True,
    )
    assert chat["chat_template_kwargs"] == {"a": 1} and chat["max_tokens"] == 4
    assert convert({"messages": []})["max_tokens"] == 4096  # llama-server's default when absent


@pytest.mark.parametrize(
    "choice,expected",
    [
        ({"type": "auto"}, "auto"),
        ({"type": "tool", "name": "f"}, "required"),
        ({"type": "none"}, "none"),
    ],
)
def test_tool_choice(choice, expected):
    assert convert(ask(tools=[WEATHER], tool_choice=choice))["tool_choice"] == expected


# -- responses --------------------------------------------------------------------------------


def test_message_shape(client):
    r = client.post("/v1/messages", json=ask(system="Be brief."))
    assert r.status_code == 200
    body = r.json()
    assert body["type"] == "message" and body["role"] == "assistant" and body["model"] == "claude-x"
    assert body["id"].startswith("msg_")
    assert body["content"] == [{"type": "text", "text": "abcd"}]
    assert body["stop_reason"] == "max_tokens" and body["stop_sequence"] is None
    usage = body["usage"]
    assert set(usage) == {"cache_read_input_tokens", "input_tokens", "output_tokens"}
    assert (
        usage["output_tokens"] == 4 and usage["input_tokens"] + usage["cache_read_input_tokens"] > 0
    )
    assert "timings" not in body


def test_stop_sequence_ends_the_turn(client):
    body = client.post("/v1/messages", json=ask(max_tokens=20, stop_sequences=["d"])).json()
    assert body["content"][0]["text"] == "abc"
    assert (body["stop_reason"], body["stop_sequence"]) == ("end_turn", "d")


def test_one_stop_sequence_as_a_string(client):
    body = client.post("/v1/messages", json=ask(max_tokens=20, stop_sequences="c")).json()
    assert (body["content"][0]["text"], body["stop_sequence"]) == ("ab", "c")


def test_no_tokens_wanted(client):
    r = client.post("/v1/messages", json=ask(max_tokens=0)).json()
    assert (
        r["content"] == [] and r["usage"]["output_tokens"] == 0 and r["stop_reason"] == "max_tokens"
    )
    ev = events(client.post("/v1/messages", json=ask(max_tokens=0, stream=True)).text)
    assert [n for n, _ in ev] == ["message_start", "message_delta", "message_stop"]


def test_stream_events(client):
    r = client.post("/v1/messages", json=ask(stream=True, max_tokens=3))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = events(r.text)
    names = [n for n, _ in ev]
    assert names == ["message_start", "content_block_start"] + ["content_block_delta"] * 3 + [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = ev[0][1]["message"]
    assert (
        start["content"] == []
        and start["stop_reason"] is None
        and start["usage"]["output_tokens"] == 0
    )
    assert start["usage"]["input_tokens"] + start["usage"]["cache_read_input_tokens"] > 0
    assert ev[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert "".join(d["delta"]["text"] for n, d in ev if n == "content_block_delta") == "abc"
    assert ev[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert ev[-2][1]["usage"] == {"output_tokens": 3}


def test_count_tokens_is_the_prompt_messages_evaluates(client):
    body = ask(system=[{"type": "text", "text": "S"}], tools=[WEATHER])
    n = client.post(
        "/v1/messages/count_tokens", json={k: v for k, v in body.items() if k != "max_tokens"}
    )
    assert n.status_code == 200 and set(n.json()) == {"input_tokens"}
    usage = client.post("/v1/messages", json=body).json()["usage"]
    assert n.json()["input_tokens"] == usage["input_tokens"] + usage["cache_read_input_tokens"]
    # the fake template: "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    prompt = (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert n.json()["input_tokens"] == len(prompt.encode()) + 1  # + BOS


def test_count_tokens_counts_thinking_history(client):
    # FakeChatTemplate ignores reasoning_content; what reaches the template is checked in to_chat tests
    msgs = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "t"}, {"type": "text", "text": "a"}],
        },
    ]
    r = client.post("/v1/messages/count_tokens", json={"messages": msgs})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


def test_empty_conversation_is_the_generation_prompt(client):
    r = client.post("/v1/messages", json={"max_tokens": 2, "messages": []})
    assert r.status_code == 200 and r.json()["type"] == "message"


@pytest.mark.parametrize(
    "body,status,words",
    [
        ({"max_tokens": 5}, 400, "messages"),
        ({"max_tokens": 5, "messages": [{"role": "user"}]}, 400, "must contain 'content'"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": 5}]}, 400, "content"),
        ({"max_tokens": "x", "messages": []}, 400, "max_tokens"),
        ({"messages": [], "temperature": -1}, 400, "temperature"),
        ({"messages": [], "tools": [{"description": "nameless"}]}, 400, "tools[0]"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "AAAA",
                                },
                            }
                        ],
                    }
                ]
            },
            500,
            "image input is not supported",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "x",
                                "content": [
                                    {"type": "text", "text": "f"},
                                    {
                                        "type": "image",
                                        "source": {"type": "url", "url": "http://x/y.png"},
                                    },
                                ],
                            }
                        ],
                    }
                ]
            },
            500,
            "image input is not supported",
        ),
        ({"messages": [{"role": "robot", "content": "beep"}]}, 400, "role"),
        ({"messages": [], "stop_sequences": ["s"] * 17}, 400, "stop_sequences"),
    ],
)
def test_errors(client, body, status, words):
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = client.post(path, json=body)
        if path.endswith("count_tokens") and words in (
            "max_tokens",
            "temperature",
            "stop_sequences",
        ):
            continue  # count_tokens does not read the generation fields
        assert r.status_code == status, (path, r.text)
        err = r.json()
        assert err["type"] == "error" and err["error"]["code"] == status
        assert words.lower() in err["error"]["message"].lower()


def test_bad_json_is_an_anthropic_shaped_400(client):
    r = client.post("/v1/messages", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error"


# -- scripted replies: tool use and thinking --------------------------------------------------------


@pytest.fixture
def script(server, monkeypatch):
    """script(pieces, template_source=None, **kw): the next requests get this reply."""

    def set_reply(pieces, template_source=None, **kw):
        sched = server.state.scheduler
        monkeypatch.setattr(sched, "submit", lambda req: ScriptedHandle(req, list(pieces), **kw))
        if template_source is not None:
            template = FakeChatTemplate()
            template.source = template_source
            monkeypatch.setattr(server.state, "chat_template", template)

    return set_reply


HERMES = [
    "I will check.",
    "\n<tool_",
    'call>\n{"name": "get_weather", ',
    '"arguments": {"location": "Paris"}}\n</tool_call>',
]


def test_tool_use_block(client, script):
    script(HERMES)
    body = client.post("/v1/messages", json=ask(tools=[WEATHER])).json()
    assert body["stop_reason"] == "tool_use"
    text, use = body["content"]
    assert text == {"type": "text", "text": "I will check."}
    assert (
        use["type"] == "tool_use"
        and use["name"] == "get_weather"
        and use["input"] == {"location": "Paris"}
    )
    assert use["id"]


def test_no_tools_declared_means_no_parsing(client, script):
    script(HERMES)
    body = client.post("/v1/messages", json=ask()).json()
    assert body["stop_reason"] == "end_turn" and body["content"][0]["text"] == "".join(HERMES)
    body = client.post(
        "/v1/messages", json=ask(tools=[WEATHER], tool_choice={"type": "none"})
    ).json()
    assert [b["type"] for b in body["content"]] == ["text"]


def test_thinking_text_and_tool_use_stream_in_order(client, script):
    script(
        ["<think>", "\nPlan it", ".\n</th", "ink>\n\n", *HERMES], template_source="{# <think> #}"
    )
    ev = events(client.post("/v1/messages", json=ask(tools=[WEATHER], stream=True)).text)
    starts = [d for n, d in ev if n == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [
        (0, "thinking"),
        (1, "text"),
        (2, "tool_use"),
    ]
    assert (
        starts[2]["content_block"]["name"] == "get_weather"
        and starts[2]["content_block"]["input"] == {}
    )
    deltas = [d for n, d in ev if n == "content_block_delta"]
    assert "".join(d["delta"].get("thinking", "") for d in deltas if d["index"] == 0) == "Plan it."
    assert {"type": "signature_delta", "signature": ""} in [
        d["delta"] for d in deltas if d["index"] == 0
    ]
    assert "".join(d["delta"].get("text", "") for d in deltas if d["index"] == 1) == "I will check."
    args = "".join(d["delta"]["partial_json"] for d in deltas if d["index"] == 2)
    assert json.loads(args) == {"location": "Paris"}
    # every block stops before the next starts
    order = [
        (n, d.get("index")) for n, d in ev if n in ("content_block_start", "content_block_stop")
    ]
    assert order == [
        ("content_block_start", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_stop", 2),
    ]
    assert ev[-2][1]["delta"]["stop_reason"] == "tool_use" and ev[-1][0] == "message_stop"


def test_thinking_block_in_a_whole_message(client, script):
    script(["<think>Plan.</think>", "Answer"], template_source="{# <think> #}")
    body = client.post(
        "/v1/messages", json=ask(thinking={"type": "enabled", "budget_tokens": 100})
    ).json()
    assert body["content"] == [
        {"type": "thinking", "thinking": "Plan.", "signature": ""},
        {"type": "text", "text": "Answer"},
    ]
    script(
        ["<think>Plan.</think>", "Answer"], template_source="{# plain #}"
    )  # no thinking: all text
    assert (
        client.post("/v1/messages", json=ask()).json()["content"][0]["text"]
        == "<think>Plan.</think>Answer"
    )


def test_error_mid_stream_is_an_error_event(client, script):
    script(["a", "b"], fail=True)
    ev = events(client.post("/v1/messages", json=ask(stream=True)).text)
    assert ev[0][0] == "message_start"
    assert (
        ev[-1][0] == "error" and ev[-1][1]["type"] == "error" and ev[-1][1]["error"]["code"] == 500
    )


def test_official_sdk(server, script):
    import anthropic

    c = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    m = c.messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    assert m.content[0].text == "abc" and m.usage.output_tokens == 3
    assert (
        c.messages.count_tokens(
            model="m", messages=[{"role": "user", "content": "hi"}]
        ).input_tokens
        > 0
    )
    script(HERMES)
    with c.messages.stream(
        model="m", max_tokens=50, tools=[WEATHER], messages=[{"role": "user", "content": "hi"}]
    ) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"location": "Paris"}
    with pytest.raises(anthropic.BadRequestError):
        c.messages.create(model="m", max_tokens=3, messages=[{"role": "user"}])


def test_a_continued_assistant_message_starts_the_reply():
    from engine.server.anthropic import MessageBuilder, _prefill_text

    chat = to_chat(
        MessagesRequest.model_validate(
            {
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello, I am"},
                ]
            }
        )
    )
    assert _prefill_text(chat, "<|im_start|>assistant\nHello, I am") == "Hello, I am"
    assert _prefill_text(chat, "<|im_start|>assistant\n") == ""  # not continued: a new turn
    b = MessageBuilder(
        "m",
        tool_names=[],
        parse_tools=False,
        reasoning=False,
        starts_inside=False,
        stop_sequences=[],
        n_prompt=3,
    )
    b.prefill("Hello, I am")
    step = GenerationStep(
        token=5,
        text_delta=" a bot",
        logprob=0.0,
        top_logprobs=(),
        finish_reason="stop",
        n_prompt=3,
        n_generated=1,
        n_cached=0,
        t_prompt_ms=0.0,
        t_gen_ms=0.0,
    )
    ev = b.step_events(step)
    assert (
        "".join(e["delta"]["text"] for e in ev if e["type"] == "content_block_delta")
        == "Hello, I am a bot"
    )
    assert b.response()["content"] == [{"type": "text", "text": "Hello, I am a bot"}]


def test_too_many_stop_sequences_is_a_400(client):
    r = client.post("/v1/messages", json=ask(stop_sequences=[str(i) for i in range(17)]))
    assert r.status_code == 400 and "at most 16 stop strings" in r.json()["error"]["message"]
    r = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "stop": [str(i) for i in range(17)]},
    )
    assert r.status_code == 400 and "at most 16 stop strings" in r.json()["error"]["message"]
