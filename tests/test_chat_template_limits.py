"""Hostile chat templates end in a TemplateLimitError naming the template, never in a hang.

Each case below hung the renderer (or ran it out of memory) before engine/tokenizer/template_sandbox.py;
here each must fail within a bounded time. Cases that only the time budget stops run with a short one.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import jinja2.ext
import jinja2.sandbox
import pytest

from engine.errors import TemplateError, TemplateLimitError
from engine.tokenizer import template_sandbox
from engine.tokenizer.chat_template import ChatTemplate

HI = [{"role": "user", "content": "hi"}]
SHORT_BUDGET_S = 0.3
BOUND_S = 1.5  # any case: fails well within this (the short budget plus a busy machine)

# (template, what the error says): stopped by a size, range or depth limit, at once
LIMITED = {
    "nested range loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "range()",
    ),
    "huge string multiplication": ("{{ 'a' * 1000000000 }}", "repeated string"),
    "namespace doubling with ~": (
        "{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
        "joined string",
    ),
    "namespace doubling with +": (
        "{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x + ns.x %}{% endfor %}",
        "a string",
    ),
    "huge list": ("{% set l = [0] * 1000000000 %}{{ l | length }}", "repeated list"),
    "list doubling": (
        "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
        "a list",
    ),
    "macro recursion": ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "nested macros"),
    "recursive loop": (
        "{% for x in [[1]] recursive %}{{ loop([[1]]) }}{% endfor %}",
        "nested calls",
    ),
    "shared strings joined": (
        "{% set l = ['x' * 1000000] * 100000 %}{{ l | join }}",
        "join filter",
    ),
    "shared strings printed": ("{% set l = ['x' * 1000000] * 100000 %}{{ l }}", "printed text"),
    "shared strings as json": ("{{ (['x' * 1000000] * 100000) | tojson }}", "tojson filter"),
    "printf width": ("{{ '%1000000000d' % 1 }}", "formatted string"),
    "str.format width": ("{{ '{:1000000000}'.format(1) }}", "formatted field"),
    "str.format repeated field": (
        "{{ ('{0}' * 100000).format('x' * 1000000) }}",
        "formatted string",
    ),
    "str.center": ("{{ 'a'.center(1000000000) }}", "center()"),
    "center filter": ("{{ 'a' | center(1000000000) }}", "center filter"),
    "integer squaring": (
        "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
        "integer",
    ),
    "power": ("{{ 10 ** 1000000000 }}", "integer"),
    "replace chain": (
        "{% set ns = namespace(x='aa') %}{% for i in range(60) %}{% set ns.x = ns.x | replace('a', 'aa') %}"
        "{% endfor %}",
        "replace filter",
    ),
    "literal text in a macro loop": (
        "{% macro m() %}{% for i in range(100000) %}"
        + "L" * 20000
        + "{% endfor %}{% endmacro %}{{ m() }}",
        "block's text",
    ),
    "output loop": (
        "{% for i in range(100000) %}{% for j in range(9) %}"
        + "x" * 100
        + "{% endfor %}{% endfor %}",
        "an output",
    ),
    "batch fill": ("{{ [1] | batch(1000000000, 'x') | list | length }}", "batch"),
    "lipsum": ("{{ lipsum(100000, max=100000) }}", "lorem ipsum"),
    "striptags": ("{{ ('<a>' * 1000000) | striptags }}", "striptags"),
    "sum of lists": ("{{ ([[0] * 1000] * 3000) | sum(start=[]) | length }}", "summed list"),
    "sum of lists, quadratic": ("{{ ([[0] * 100] * 10000) | sum(start=[]) | length }}", "sum copy"),
    "constant filter bombs": (
        "{{ 'a' | center(8000000) }}" * 20,
        "an output",
    ),  # never run while compiling
}

# stopped by the time budget only: the loops repeat cheap work
TIMED = {
    "loop without output or calls": (
        "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}"
    ),
    "filtered loop": "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s if false %}{% endfor %}{% endfor %}",
    "exponential macro": (
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}"
    ),
}


def render_failing(tmpl: ChatTemplate) -> tuple[float, str]:
    """(seconds, message) of a render that must end in a TemplateLimitError."""
    t0 = time.perf_counter()
    with pytest.raises(TemplateLimitError) as info:
        tmpl.render(HI)
    assert isinstance(info.value, TemplateError)  # callers that catch TemplateError see it too
    return time.perf_counter() - t0, str(info.value)


@pytest.mark.parametrize("case", LIMITED)
def test_hostile_template_hits_a_limit(case):
    source, says = LIMITED[case]
    elapsed, message = render_failing(ChatTemplate(source, "gguf"))
    assert message.startswith("chat template 'gguf' (the model file's tokenizer.chat_template) ")
    assert says in message
    assert elapsed < BOUND_S


@pytest.mark.parametrize("case", TIMED)
def test_hostile_template_is_stopped_by_the_time_budget(case):
    tmpl = ChatTemplate(TIMED[case], "evil.jinja")
    tmpl.render_budget_s = SHORT_BUDGET_S
    elapsed, message = render_failing(tmpl)
    assert message == "chat template 'evil.jinja' exceeded its 0.3 s render budget"
    assert SHORT_BUDGET_S <= elapsed < BOUND_S


def test_recursion_error_is_the_same_clear_error(monkeypatch):
    monkeypatch.setattr(
        template_sandbox, "MAX_CALL_DEPTH", 1 << 30
    )  # let Python's own limit hit first
    _, message = render_failing(ChatTemplate(LIMITED["macro recursion"][0], "gguf"))
    assert message == (
        "chat template 'gguf' (the model file's tokenizer.chat_template) recursed too deeply "
        "(a macro that calls itself without end?)"
    )


def test_a_too_long_source_is_refused_before_compiling():
    tmpl = ChatTemplate("{{ 'x' }}" * 20000, "big.jinja")
    with pytest.raises(
        TemplateLimitError, match=r"chat template 'big.jinja' is 180,000 characters long"
    ):
        tmpl.render(HI)


def test_the_size_limit_grows_with_the_input():
    long = "y" * (10 << 20)  # over MIN_SIZE_LIMIT: a long paste must still render
    text = ChatTemplate.builtin("chatml").render([{"role": "user", "content": long}])
    assert len(text) > len(long)
    with pytest.raises(TemplateLimitError, match="repeated string"):  # but not 5x it
        ChatTemplate("{{ messages[0].content * 5 }}", "t").render(
            [{"role": "user", "content": long}]
        )


def test_a_hostile_render_leaves_other_threads_alone():
    results = []

    def legit():
        deadline = time.perf_counter() + 0.5
        while time.perf_counter() < deadline:
            results.append(ChatTemplate.builtin("chatml").render(HI))

    thread = threading.Thread(target=legit)
    thread.start()
    tmpl = ChatTemplate(TIMED["loop without output or calls"], "gguf")
    tmpl.render_budget_s = SHORT_BUDGET_S
    render_failing(tmpl)
    thread.join()
    assert results and set(results) == {"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"}


# jinja features whose compiled code the sandbox changes (loops, `~`, calls, filters, formatting)
SEMANTICS = [
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ '!' if loop.last }}{{ loop.revindex0 }}"
    "{{ loop.previtem.role if loop.previtem }}{% endfor %}",
    "{% for m in messages if m.role == 'user' %}{{ m.content ~ loop.index }}{% else %}none{% endfor %}",
    "{% for i in range(3) %}{% for j in range(i) %}{{ i ~ j }}{% if j > 0 %}{% break %}{% endif %}{% endfor %}"
    "{% endfor %}",
    "{% for k, v in {'a': 1, 'b': [1, 2]}.items() %}{{ k }}={{ v }};{% endfor %}{% for x in undefined_name %}"
    "x{% else %}empty{% endfor %}",
    "{% for x in [[1, [2]], [3]] recursive %}[{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}"
    "{% endif %}]{% endfor %}",
    "{% macro tag(name) %}<{{ name }}>{{ caller() }}</{{ name }}>{% endmacro %}"
    "{% call tag('b') %}{{ messages | map(attribute='role') | join(', ') }}{% endcall %}",
    "{% set x %}{{ messages | length }} messages{% endset %}{{ x | upper }} {{ '%s-%05.1f' % ('a', 2.5) }}"
    " {{ '{}:{:>4}'.format('k', 7) }} {{ 'a,b' | replace(',', ';') }} {{ [1, 2] ~ 'x' }} {{ 2 ** 10 }}",
    "{{ messages | tojson }} {{ {'b': 1, 'a': none} | tojson(indent=2) }} {{ ('a' * 3) | center(9) }}|"
    "{{ 'x\ny' | indent(2, true) }} {{ [3, 1, 2] | sort | sum }} {{ [1, 2, 3] | batch(2) | list }}",
    "{% set ns = namespace(s='', n=0) %}{% for m in messages %}{% set ns.s = ns.s + m.role[0] %}"
    "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.s }}{{ ns.n }}{{ ns.s * 2 }}{{ 'ab'.center(6, '*') }}",
    "{% autoescape true %}{{ '<b>' ~ messages[0].content }}{{ '<i>' | striptags }}{% endautoescape %}",
]


@pytest.mark.parametrize("source", SEMANTICS)
def test_sandbox_renders_as_jinja_does(source):
    plain = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    plain.filters["tojson"] = lambda x, indent=None: __import__("json").dumps(
        x, ensure_ascii=False, indent=indent
    )
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "<u1>"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "u2"},
    ]
    expected = plain.from_string(source).render(
        messages=messages, add_generation_prompt=True, bos_token="", eos_token=""
    )
    assert ChatTemplate(source, "t").render(messages) == expected


# -- the front ends ----------------------------------------------------------------------------


def test_server_answers_a_hostile_template_with_a_json_error():
    from engine.server import start_server
    from engine.server.testing import make_fake_scheduler

    tmpl = ChatTemplate(TIMED["loop without output or calls"], "gguf")
    tmpl.render_budget_s = SHORT_BUDGET_S
    sched = make_fake_scheduler(n_slots=1)
    handle = start_server(sched, port=0, chat_template=tmpl)
    try:
        with httpx.Client(base_url=handle.url, timeout=10) as c:
            for path in ("/v1/chat/completions", "/apply-template"):
                t0 = time.perf_counter()
                r = c.post(path, json={"messages": HI})
                assert time.perf_counter() - t0 < 5
                # the model's template is at fault, not the request: a 500, as llama-server answers
                assert r.status_code == 500, r.text
                error = r.json()["error"]
                assert error["code"] == r.status_code
                assert (
                    "chat template 'gguf' (the model file's tokenizer.chat_template) exceeded its 0.3 s "
                    "render budget" in error["message"]
                )
            assert c.get("/health").status_code == 200  # and it keeps serving
    finally:
        handle.stop()
        sched.stop()


def test_cli_chat_reports_a_hostile_template_in_one_line(tmp_path):
    from ggufgen import write_tiny_model

    model = write_tiny_model(
        tmp_path / "hostile.gguf", chat_template=LIMITED["huge string multiplication"][0]
    )
    r = subprocess.run(
        [sys.executable, "-m", "engine", "chat", "-m", str(model), "-c", "256"],
        input="hi\n",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(Path(__file__).resolve().parents[1]),
    )
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "error: chat template 'gguf' (the model file's tokenizer.chat_template) would build a repeated string: "
        "1,000,000,000 characters, over its limit of 8,388,608"
    ]
