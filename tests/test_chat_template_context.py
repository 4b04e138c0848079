"""What llama.cpp's template renderer gives a chat template besides the messages: today's date,
enable_thinking (--reasoning), tools only when there are some, its lenient treatment of
missing values, and its message workarounds (developer role, templates without a system role)."""

from __future__ import annotations

import datetime

import pytest

from engine.cli import build_parser
from engine.errors import TemplateError
from engine.server.startup import server_options
from engine.tokenizer.chat_template import ChatTemplate

USER = [{"role": "user", "content": "What is today?"}]
# the end of Qwen3's template: an empty thought when thinking is switched off
QWEN3_TAIL = (
    "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<A>"
    "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}"
    "{% endif %}"
)


def test_date_variables_are_todays_date():
    src = "{{ date_string }}|{{ datetime }}|{{ strftime_now('%Y-%m-%d') }}"
    today = datetime.date.today()
    assert ChatTemplate(src, "t").render(USER) == (
        f"{today.strftime('%d %b %Y')}|{today.strftime('%b %d %Y')}|{today.isoformat()}"
    )
    # a request's chat_template_kwargs still win
    assert (
        ChatTemplate("{{ date_string }}", "t").render(USER, date_string="1 Jan 2000")
        == "1 Jan 2000"
    )


def test_enable_thinking_defaults_to_whether_the_template_has_the_switch():
    thinking = ChatTemplate(QWEN3_TAIL, "qwen3")
    assert thinking.supports_thinking
    assert thinking.render(USER).endswith("<A>")
    assert thinking.render(USER, enable_thinking=False).endswith("<A><think></think>")
    plain = ChatTemplate("{{ enable_thinking is defined }}", "plain")  # always set, to false here
    assert not plain.supports_thinking and plain.render(USER) == "True"


def test_tools_are_undefined_unless_there_are_some():
    src = "{% if tools is defined %}T{{ tools | length }}{% else %}none{% endif %}"
    t = ChatTemplate(src, "t")
    assert [t.render(USER), t.render(USER, tools=[]), t.render(USER, tools=[{"name": "f"}])] == [
        "none",
        "none",
        "T1",
    ]


@pytest.mark.parametrize(
    "src, expected",
    [
        ("{{ 'a' + functions + 'b' }}", "ab"),  # firefunction-v2 concatenates an unset variable
        ("{{ missing + 'x' }}", "x"),
        (
            "{{ nothing ~ 'x' ~ nothing }}",
            "x",
        ),  # `nothing` is None (below): jinja would print 'None'
        ("{{ 'x' + nothing }}", "x"),
        ("{{ missing.deeper.still | default('d') }}", "d"),
        ("{% for x in missing %}{{ x }}{% endfor %}ok", "ok"),
        ("{{ 'y' if 'a' in messages[0] else 'n' }}", "n"),
    ],
)
def test_missing_values_are_lenient_as_in_llama_cpp(src, expected):
    assert ChatTemplate(src, "t").render(USER, nothing=None) == expected


@pytest.mark.parametrize(
    "src",
    [
        "{{ missing + 1 }}",
        "{{ missing * 2 }}",
        "{{ missing() }}",
        "{{ 1 + nothing }}",
        "{{ (1).__class__ + 'x' }}",
    ],
)
def test_other_operations_on_missing_values_still_fail_clearly(src):
    with pytest.raises(TemplateError, match="chat template 't' failed to render"):
        ChatTemplate(src, "t").render(USER, nothing=None)


def test_developer_messages_render_as_system_except_in_channel_templates():
    msgs = [{"role": "developer", "content": "d"}, {"role": "user", "content": "u"}]
    assert (
        ChatTemplate("{% for m in messages %}{{ m.role }} {% endfor %}", "t").render(msgs)
        == "system user "
    )
    gpt_oss = "{# <|channel|> #}{% for m in messages %}{{ m.role }} {% endfor %}"
    assert ChatTemplate(gpt_oss, "t").render(msgs) == "developer user "


def test_a_template_without_a_system_role_gets_it_merged_into_the_next_message():
    # Gemma 2's template refuses the role outright
    src = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    )
    t = ChatTemplate(src, "gemma2")
    assert not t.supports_system_role
    assert (
        t.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
        == "<user>S\nU"
    )
    assert t.render([{"role": "system", "content": "S"}]) == ""  # nothing left to merge into
    assert ChatTemplate("{% for m in messages %}{{ m.role }}{% endfor %}", "t").supports_system_role


def _serve_options(*argv: str):
    args = build_parser().parse_args(["serve", "-m", "x.gguf", *argv])
    return server_options(args)


@pytest.mark.parametrize(
    "argv, expected",
    [
        ((), None),
        (("--reasoning", "off"), False),
        (("-rea", "on"), True),
        (("--reasoning", "auto"), None),
        (("--reasoning", "disabled"), False),
        (("--reasoning", "off", "--chat-template-kwargs", '{"enable_thinking": true}'), True),
    ],
)
def test_reasoning_flag_sets_enable_thinking(argv, expected):
    kwargs = _serve_options(*argv).chat_template_kwargs
    assert kwargs.get("enable_thinking") is expected


def test_a_switch_in_the_middle_is_not_a_thinking_switch():
    # Apertus: "Deliberation: enabled/disabled" in its system text, the generation prompt unchanged
    src = (
        "Deliberation: {{ 'enabled' if enable_thinking else 'disabled' }}|"
        "{% for m in messages %}{{ m.content }}{% endfor %}<A>"
    )
    t = ChatTemplate(src, "apertus")
    assert not t.supports_thinking and t.render(USER).startswith("Deliberation: disabled")
    # a template that shows an assistant's reasoning has the switch wherever it acts
    shows = (
        "{% if enable_thinking %}T{% endif %}{% for m in messages %}{{ m.content }}"
        "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{% endfor %}"
    )
    assert ChatTemplate(shows, "t").supports_thinking


def test_reasoning_preservation_variables():
    src = "{{ preserve_reasoning }} {{ preserve_thinking }} {{ clear_thinking }} {{ reasoning_strength }}"
    t = ChatTemplate(src, "t")
    assert t.render(USER) == "True True False "
    assert (
        t.render(USER, preserve_reasoning=False, reasoning_effort="low") == "False False True low"
    )
    assert t.render(USER, clear_thinking=True) == "True True True "


TOOL_CALL = {
    "id": "call00001",
    "type": "function",
    "function": {"name": "f", "arguments": '{"city": "Paris"}'},
}
CALLS = [
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
]


def test_string_arguments_are_parsed_for_templates_that_read_objects():
    src = (
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "{% for k, v in c.function.arguments.items() %}{{ k }}={{ v }}{% endfor %}{% endfor %}{% endfor %}"
    )
    t = ChatTemplate(src, "glm")
    assert t.supports_object_arguments and t.render(CALLS) == "city=Paris"
    verbatim = ChatTemplate(
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "{{ c.function.arguments }}{% endfor %}{% endfor %}",
        "t",
    )
    assert verbatim.render(CALLS) == '{"city": "Paris"}'  # prints the text it was given
    bad = [
        CALLS[0],
        {
            **CALLS[1],
            "tool_calls": [{**TOOL_CALL, "function": {"name": "f", "arguments": "{oops"}}],
        },
    ]
    with pytest.raises(TemplateError, match="not valid JSON"):
        t.render(bad)


def test_templates_may_append_to_lists_within_limits():
    src = "{% set xs = [] %}{% for m in messages %}{% set _ = xs.append(m.role) %}{% endfor %}{{ xs | join(',') }}"
    assert ChatTemplate(src, "kimi").render(CALLS) == "user,assistant"
    assert ChatTemplate("{% set xs = [1, 2] %}{{ xs.pop() }}{{ xs }}", "t").render(USER) == "2[1]"
    with pytest.raises(TemplateError):
        ChatTemplate("{% set d = {} %}{{ d.update({'a': 1}) }}", "t").render(
            USER
        )  # other mutations: no


@pytest.mark.parametrize(
    "argv, key, expected",
    [
        (("--reasoning-effort", "low"), "reasoning_effort", "low"),
        (("--reasoning-effort", "default"), "reasoning_effort", None),
        (("--no-reasoning-preserve",), "preserve_reasoning", False),
        (("--reasoning-preserve",), "preserve_reasoning", True),
        ((), "preserve_reasoning", None),  # the template's default (True) applies
    ],
)
def test_reasoning_effort_and_preserve_flags(argv, key, expected):
    assert _serve_options(*argv).chat_template_kwargs.get(key) == expected


def test_safe_is_a_no_op_and_tojson_takes_lazy_sequences():
    # functionary v3.1: a `safe` string plus JSON must not HTML-escape the JSON
    src = "{{ 'x: '|safe + tools[0] | tojson }} {{ tools | map(attribute='name') | tojson }}"
    out = ChatTemplate(src, "t").render(USER, tools=[{"name": "f"}])
    assert out == 'x: {"name": "f"} ["f"]'


def test_add_generation_prompt_is_undefined_when_off():
    # rwkv-world: `{% if not add_generation_prompt is defined %}{% set add_generation_prompt = true %}`
    src = "{{ 'defined' if add_generation_prompt is defined else 'undefined' }}"
    t = ChatTemplate(src, "t")
    assert (
        t.render(USER, add_generation_prompt=True),
        t.render(USER, add_generation_prompt=False),
    ) == ("defined", "undefined")
