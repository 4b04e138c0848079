"""Reading replies: reasoning, answer text and tool calls in each model family's syntax, whole
and streamed (engine/server/tool_calls.py)."""

from __future__ import annotations

import json

import pytest

from engine.server.tool_calls import (
    ParsedMessage,
    StreamParser,
    ToolCall,
    parse_message,
    parse_tool_calls,
    prompt_opens_reasoning,
    split_reasoning,
)

TOOLS = {"get_weather", "search"}
PARIS = {"location": "Paris"}


def calls_of(text, names=TOOLS):
    content, calls = parse_tool_calls(text, names)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": {"location": "Paris"}}',  # unclosed at the end
        '{"name": "get_weather", "parameters": {"location": "Paris"}}',  # Llama 3.x
        '<|python_tag|>{"name": "get_weather", "parameters": {"location": "Paris"}}',
        '{"type": "function", "name": "get_weather", "parameters": {"location": "Paris"}}',
        '[{"name": "get_weather", "arguments": {"location": "Paris"}}]',
        '<function=get_weather>{"location": "Paris"}</function>',  # Functionary / Llama 3.1
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Paris"}}]',  # Mistral
        '[TOOL_CALLS]get_weather[ARGS]{"location": "Paris"}',  # Mistral v11+
        '{"tool_call": {"name": "get_weather", "arguments": {"location": "Paris"}}}',  # llama.cpp generic
        "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>",
        '<tool_call>{"name": "get_weather", "arguments": "{\\"location\\": \\"Paris\\"}"}</tool_call>',
    ],
)
def test_each_format_gives_the_call(text):
    assert calls_of(text) == ("", [("get_weather", PARIS)])


def test_text_around_a_tagged_call_is_the_content():
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>\n'
    assert calls_of(text) == ("Let me look.", [("get_weather", PARIS)])


def test_several_calls_keep_their_order():
    text = (
        '<tool_call>{"name": "get_weather", "arguments": {"location": "Paris"}}</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'
    )
    assert calls_of(text)[1] == [("get_weather", PARIS), ("search", {"q": "x"})]
    llama = '{"name": "get_weather", "parameters": {"location": "Paris"}}; {"name": "search", "parameters": {}}'
    assert calls_of(llama)[1] == [("get_weather", PARIS), ("search", {})]
    mistral = '[TOOL_CALLS]get_weather[ARGS]{"location": "Paris"}[TOOL_CALLS]search[ARGS]{}'
    assert calls_of(mistral)[1] == [("get_weather", PARIS), ("search", {})]


def test_bare_json_must_name_a_declared_tool():
    answer = '{"name": "Alice", "parameters": {"age": 3}}'
    assert parse_tool_calls(answer, TOOLS) == (answer, [])
    assert calls_of('{"answer": 42}') == ('{"answer": 42}', [])
    assert calls_of('{"name": "get_weather", "parameters": {}} and more') == (
        '{"name": "get_weather", "parameters": {}} and more',
        [],
    )


def test_plain_text_and_broken_calls_stay_text():
    assert parse_tool_calls("Hello there", TOOLS) == ("Hello there", [])
    broken = "<tool_call>{not json</tool_call>"
    assert parse_tool_calls(broken, TOOLS) == (broken, [])


def test_ids_are_kept_or_made():
    _, calls = parse_tool_calls(
        '[TOOL_CALLS][{"name": "search", "arguments": {}, "id": "abc123XYZ"}]', TOOLS
    )
    assert calls[0].id == "abc123XYZ"
    _, calls = parse_tool_calls('<tool_call>{"name": "search", "arguments": {}}</tool_call>', TOOLS)
    assert calls[0].id.startswith("call_") and len(calls[0].id) > 10


def test_input_is_an_object_or_empty():
    assert ToolCall("f", '{"a": 1}').input() == {"a": 1}
    assert ToolCall("f", "[1]").input() == {}
    assert ToolCall("f", "not json").input() == {}


def test_reasoning_split():
    assert split_reasoning("<think>\nhmm\n</think>\n\nAnswer") == ("hmm", "Answer")
    assert split_reasoning("hmm</think>Answer", starts_inside=True) == ("hmm", "Answer")
    assert split_reasoning("<think>still thinking") == ("still thinking", "")
    assert split_reasoning("No thoughts") == ("", "No thoughts")
    assert prompt_opens_reasoning("<|Assistant|><think>\n") and not prompt_opens_reasoning(
        "assistant\n"
    )


def test_parse_message_reads_only_what_is_asked():
    text = '<think>plan</think>Sure.<tool_call>{"name": "search", "arguments": {}}</tool_call>'
    msg = parse_message(text, tool_names=TOOLS, parse_tools=True, reasoning=True)
    assert (msg.reasoning, msg.content, [c.name for c in msg.tool_calls]) == (
        "plan",
        "Sure.",
        ["search"],
    )
    plain = parse_message(text)
    assert plain.content == text and not plain.reasoning and not plain.tool_calls


STREAM_CASES = [
    (
        "<think>\nLet me think.\n</think>\n\nOk. <tool_call>\n"
        '{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>',
        dict(reasoning=True),
    ),
    ('{"name": "get_weather", "parameters": {"location": "Paris"}}', {}),
    ('{"name": "not_a_tool", "parameters": {}}', {}),
    ("Plain answer with a < sign and [brackets] and <tool no.", {}),
    ("  leading and trailing space  ", {}),
    ("reasoning only</think>answer", dict(reasoning=True, starts_inside=True)),
    ("<thinking is not a tag", dict(reasoning=True)),
    ('[TOOL_CALLS]search[ARGS]{"q": "a"}', {}),
]


@pytest.mark.parametrize("text,kw", STREAM_CASES)
@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_streamed_reply_matches_the_whole_one(text, kw, chunk):
    whole = parse_message(text, tool_names=TOOLS, parse_tools=True, **kw)
    sp = StreamParser(tool_names=TOOLS, parse_tools=True, **kw)
    deltas = []
    for i in range(0, len(text), chunk):
        deltas += sp.feed(text[i : i + chunk])
    rest, msg = sp.finish()
    deltas += rest
    assert "".join(t for k, t in deltas if k == "content") == msg.content == whole.content
    assert "".join(t for k, t in deltas if k == "reasoning") == msg.reasoning == whole.reasoning
    assert [(c.name, c.arguments) for c in msg.tool_calls] == [
        (c.name, c.arguments) for c in whole.tool_calls
    ]
    kinds = [k for k, _ in deltas]
    assert kinds == sorted(kinds, key=lambda k: k == "content")  # reasoning all comes first


def test_stream_releases_text_early_but_holds_back_markers():
    sp = StreamParser(tool_names=TOOLS, parse_tools=True)
    assert sp.feed("Hello") == [("content", "Hello")]
    assert sp.feed(" <tool_") == []  # could be a tool call: held
    assert sp.feed("box>") == [("content", " <tool_box>")]
    assert sp.feed(" then <tool_call>{") == [("content", " then")]
    assert sp.feed('"name": "search", "arguments": {}}</tool_call>') == []
    rest, msg = sp.finish()
    assert rest == [] and [c.name for c in msg.tool_calls] == ["search"]
    assert msg.content == "Hello <tool_box> then"


def test_stream_without_tools_sends_everything_at_once():
    sp = StreamParser()
    assert sp.feed("<tool_call>{") == [("content", "<tool_call>{")]
    assert sp.finish() == ([], parse_message("<tool_call>{"))


# -- harmony (gpt-oss) ------------------------------------------------------------------------

ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather. Use the tool.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris."
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"location": "Paris"}'
)


def harmony(text, **kw):
    return parse_message(text, tool_names=TOOLS, harmony=True, **{"reasoning": True, **kw})


def test_harmony_reasoning_and_final_answer():
    msg = harmony(ANALYSIS + FINAL)
    assert (msg.reasoning, msg.content, msg.tool_calls) == (
        "The user wants the weather. Use the tool.",
        "It is sunny in Paris.",
        [],
    )
    assert harmony("<|channel|>final<|message|>Hi!").content == "Hi!"  # no analysis
    assert harmony(ANALYSIS + FINAL + "<|return|>").content == "It is sunny in Paris."


@pytest.mark.parametrize(
    "call",
    [
        CALL,
        CALL + "<|call|>",
        # the recipient in the role header, constraint without <|constrain|>
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"location": "Paris"}<|call|>',
        # stray commentary before analysis-channel tool calls, as gpt-oss-20b writes them
        '<|start|>assistant<|channel|>analysis to=functions.get_weather<|message|>{"location":"Paris"}',
    ],
)
def test_harmony_tool_call(call):
    msg = harmony(ANALYSIS + call, parse_tools=True)
    assert msg.reasoning.startswith("The user wants")
    assert msg.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_weather", PARIS)]
    assert msg.tool_calls[0].id.startswith("call_")


def test_harmony_preamble_is_content_and_unsolicited_calls_are_dropped():
    text = "<|channel|>commentary<|message|>Checking.<|end|>" + CALL
    msg = harmony(text, parse_tools=True)
    assert msg.content == "Checking." and len(msg.tool_calls) == 1
    # tools not parsed (none declared) or undeclared: the call is dropped, as llama.cpp does
    assert harmony(text) == ParsedMessage(content="Checking.")
    other = text.replace("functions.get_weather", "functions.delete_all")
    assert harmony(other, parse_tools=True).tool_calls == []
    builtin = (
        ANALYSIS + "<|start|>assistant<|channel|>analysis to=browser.search<|message|>{}<|call|>"
    )
    assert harmony(builtin, parse_tools=True) == ParsedMessage(
        reasoning="The user wants the weather. Use the tool."
    )


def test_harmony_reasoning_format_none_keeps_the_analysis_in_the_content():
    msg = harmony(ANALYSIS + FINAL, reasoning=False)
    assert msg.reasoning == ""
    assert msg.content == ANALYSIS + "It is sunny in Paris."


def test_harmony_without_markup_is_plain_content():
    assert harmony("Just text.") == ParsedMessage(content="Just text.")


def test_harmony_tool_arguments_are_kept_as_written():
    """As llama.cpp returns them: the JSON text with the model's spacing, not re-serialised."""
    msg = harmony(
        CALL.replace('{"location": "Paris"}', '{\n \t"location"\n:"Paris"}'), parse_tools=True
    )
    assert msg.tool_calls[0].arguments == '{\n \t"location"\n:"Paris"}'
    msg = harmony(CALL.replace('{"location": "Paris"}', "location=Paris"), parse_tools=True)
    assert msg.tool_calls[0].arguments == "location=Paris"


@pytest.mark.parametrize(
    "text,kw",
    [
        (ANALYSIS + FINAL, {}),
        (ANALYSIS + FINAL, dict(reasoning=False)),
        (ANALYSIS + CALL + "<|call|>", dict(parse_tools=True)),
        ("<|channel|>commentary<|message|>Checking.<|end|>" + CALL, dict(parse_tools=True)),
        (
            '<|start|>assistant to=functions.search<|channel|>commentary json<|message|>{"q": "a"}',
            dict(parse_tools=True),
        ),
        ("<|channel|>final<|message|>A <|en answer with a near-marker", {}),
        ("Plain text without markup.", {}),
    ],
)
@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_harmony_streamed_reply_matches_the_whole_one(text, kw, chunk):
    kw = {"reasoning": True, **kw}
    whole = parse_message(text, tool_names=TOOLS, harmony=True, **kw)
    sp = StreamParser(tool_names=TOOLS, harmony=True, **kw)
    deltas = []
    for i in range(0, len(text), chunk):
        deltas += sp.feed(text[i : i + chunk])
    rest, msg = sp.finish()
    deltas += rest
    assert "".join(t for k, t in deltas if k == "content") == msg.content == whole.content
    assert "".join(t for k, t in deltas if k == "reasoning") == msg.reasoning == whole.reasoning
    assert [(c.name, c.arguments) for c in msg.tool_calls] == [
        (c.name, c.arguments) for c in whole.tool_calls
    ]
    if kw["reasoning"]:  # no markup reaches the client
        assert not any(
            m in t
            for _, t in deltas
            for m in ("<|channel|>", "<|message|>", "<|end|>", "<|start|>")
        )


def test_harmony_stream_sends_reasoning_and_answer_as_they_come():
    sp = StreamParser(harmony=True, reasoning=True)
    assert sp.feed("<|channel|>analysis<|mess") == []
    assert sp.feed("age|>Thinking") == [("reasoning", "Thinking")]
    assert sp.feed(" more<|end|>") == [("reasoning", " more")]
    assert sp.feed("<|start|>assistant<|channel|>final<|message|>Ans") == [("content", "Ans")]
    assert sp.feed("wer") == [("content", "wer")]
    assert sp.finish() == ([], ParsedMessage(content="Answer", reasoning="Thinking more"))
