"""engine/server/constraints.py: grammar / json_schema / response_format in request bodies,
and the constrained output over HTTP (fake scheduler, byte vocabulary)."""

from __future__ import annotations

import json

import httpx
import pytest

from engine.errors import APIError
from engine.server import ServerOptions, start_server
from engine.server.constraints import request_grammar, response_format_schema
from engine.server.schemas import ChatCompletionRequest, CompletionRequest
from engine.server.testing import FakeChatTemplate, FakeTokenizer, make_fake_scheduler

MESSAGES = [{"role": "user", "content": "hi"}]
TOK = FakeTokenizer()


def chat_body(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=MESSAGES, **kw)


def completion_body(**kw) -> CompletionRequest:
    return CompletionRequest(prompt="hi", **kw)


def schema_of(g) -> dict:
    assert g is not None and g.kind == "json_schema"
    return json.loads(g.source)


def api_error(fn, *a, **kw) -> APIError:
    with pytest.raises(APIError) as e:
        fn(*a, **kw)
    return e.value


# -- body -> grammar ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rf, schema",
    [
        ({"type": "json_object"}, {"type": "object"}),
        ({"type": "json_object", "schema": {"const": "42"}}, {"const": "42"}),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "strict": True, "schema": {"const": 1}},
            },
            {"const": 1},
        ),
        ({"type": "json_schema", "json_schema": {"name": "no-schema"}}, {"type": "object"}),
        ({"type": "json_schema", "schema": {"type": "integer"}}, {"type": "integer"}),
        ({"type": "json_schema"}, {"type": "object"}),
    ],
)
def test_constraints_response_format_forms(rf, schema):
    assert schema_of(request_grammar(chat_body(response_format=rf), chat=True)) == schema
    assert schema_of(request_grammar(completion_body(response_format=rf), chat=False)) == schema


@pytest.mark.parametrize("rf", [None, {"type": "text"}, {}])
def test_constraints_plain_text_has_no_grammar(rf):
    assert request_grammar(chat_body(response_format=rf), chat=True) is None
    assert request_grammar(chat_body(grammar=""), chat=True) is None


def test_constraints_unknown_response_format_type_is_400():
    err = api_error(response_format_schema, {"type": "sound"})
    assert err.status == 400 and "sound" in err.message and "json_object" in err.message


@pytest.mark.parametrize(
    "rf, needle",
    [
        ({"type": "json_object", "schema": 123}, "object or a boolean"),
        ({"type": "json_object", "schema": {"type": 123}}, "type"),
        ({"type": "json_object", "schema": {"type": "hiccup"}}, "hiccup"),
        ({"type": "json_schema", "json_schema": "not an object"}, "json_schema"),
    ],
)
def test_constraints_invalid_schema_is_400_naming_it(rf, needle):
    err = api_error(request_grammar, chat_body(response_format=rf), chat=True)
    assert err.status == 400 and needle in err.message and err.message.startswith("response_format")


def test_constraints_json_schema_field_and_empty_schema():
    assert schema_of(request_grammar(chat_body(json_schema={}), chat=True)) == {"type": "object"}
    g = request_grammar(completion_body(json_schema={"const": "42"}), chat=False)
    assert schema_of(g) == {"const": "42"}


def test_constraints_invalid_grammar_is_400_with_parser_message():
    err = api_error(
        request_grammar, chat_body(grammar="root ::= this is (not valid GBNF"), chat=True
    )
    assert err.status == 400 and err.message.startswith("grammar: failed to parse grammar")
    assert err.body()["error"]["param"] == "grammar"


def test_constraints_grammar_with_schema():
    """chat: both is a 400 (llama-server says so with a 500); completions: the grammar wins."""
    grammar = 'root ::= "a"'
    err = api_error(request_grammar, chat_body(grammar=grammar, json_schema={}), chat=True)
    assert err.status == 400 and "both" in err.message
    err = api_error(
        request_grammar,
        chat_body(grammar=grammar, response_format={"type": "json_object"}),
        chat=True,
    )
    assert err.status == 400 and "response_format" in err.message
    g = request_grammar(
        completion_body(grammar=grammar, json_schema={"type": "integer"}), chat=False
    )
    assert g is not None and g.kind == "gbnf" and g.source == grammar


def test_constraints_grammar_with_tools_is_400():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    err = api_error(request_grammar, chat_body(grammar='root ::= "a"', tools=tools), chat=True)
    assert err.status == 400 and "tools" in err.message
    assert request_grammar(
        chat_body(grammar='root ::= "a"', tools=tools, tool_choice="none"), chat=True
    )


def test_constraints_lazy_grammar_is_not_supported():
    err = api_error(
        request_grammar, completion_body(grammar='root ::= "a"', grammar_lazy=True), chat=False
    )
    assert err.status == 501 and "grammar_lazy" in err.message


def test_constraints_checked_against_the_vocabulary():
    g = request_grammar(completion_body(grammar='root ::= "a"'), chat=False, tokenizer=TOK)
    assert g is not None and g.kind == "gbnf"


# -- over HTTP ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client():
    sched = make_fake_scheduler(n_slots=2, n_ctx=1024)
    handle = start_server(sched, port=0, options=ServerOptions(), chat_template=FakeChatTemplate())
    with httpx.Client(base_url=handle.url, timeout=20) as c:
        yield c
    handle.stop()
    sched.stop()


def sse_text(r: httpx.Response, key) -> tuple[str, list]:
    events = [
        json.loads(line[6:])
        for line in r.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    return "".join(key(e) or "" for e in events), events


def test_constraints_http_completion_grammar(client):
    r = client.post(
        "/completion", json={"prompt": "x", "n_predict": 20, "grammar": 'root ::= "a"{5}'}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["content"] == "aaaaa" and body["stop_type"] == "eos"


def test_constraints_http_chat_json_schema_sampled(client):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": MESSAGES,
            "max_tokens": 100,
            "seed": 1,
            "temperature": 1.0,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": schema},
            },
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert isinstance(json.loads(choice["message"]["content"])["n"], int)
    assert choice["finish_reason"] == "stop"


def test_constraints_http_chat_stream_honours_grammar(client):
    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": MESSAGES,
            "max_tokens": 50,
            "stream": True,
            "temperature": 0,
            "grammar": 'root ::= "x" [0-9] [0-9] "."',
        },
    )
    assert r.status_code == 200, r.text
    text, events = sse_text(
        r, lambda e: e["choices"][0]["delta"].get("content") if e.get("choices") else None
    )
    assert len(text) == 4 and text[0] == "x" and text[1:3].isdigit() and text[3] == "."
    assert any(e.get("choices") and e["choices"][0].get("finish_reason") == "stop" for e in events)


def test_constraints_http_v1_completions_response_format(client):
    r = client.post(
        "/v1/completions",
        json={
            "prompt": "x",
            "max_tokens": 30,
            "response_format": {"type": "json_object", "schema": {"const": "ok"}},
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == '"ok"'


@pytest.mark.parametrize(
    "path, body",
    [
        ("/completion", {"prompt": "x", "grammar": "root ::= ("}),
        ("/v1/completions", {"prompt": "x", "json_schema": {"type": "hiccup"}}),
        ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {"type": "sound"}}),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "response_format": {"type": "json_object", "schema": 1}},
        ),
    ],
)
def test_constraints_http_invalid_is_400(client, path, body):
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
