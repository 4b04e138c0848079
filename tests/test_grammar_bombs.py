"""Grammars built to crash or stall the server (issue 32): each answered by a 400 or a normal
reply, and the server still up.

A rule chain of a few thousand rules overflowed the native grammar library's stack (SIGSEGV,
the whole server gone), so those cases run in a subprocess: a crash fails the test, not the
runner. engine/grammar_limits.py owns the bounds and the compiler thread.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import httpx
import pytest

from engine.errors import GrammarError
from engine.grammar import compile_grammar, gbnf_to_lark
from engine.grammar_limits import MAX_GRAMMAR_CHARS, MAX_REPETITION, MAX_RULES, check_source
from engine.server import ServerOptions, start_server
from engine.server.testing import FakeChatTemplate, FakeTokenizer, make_fake_scheduler

TOK = FakeTokenizer()


def gbnf_chain(n: int) -> str:
    return (
        "root ::= r0\n" + "".join(f'r{i} ::= "x" r{i + 1}\n' for i in range(n)) + f'r{n} ::= "y"\n'
    )


def lark_chain(n: int, terminals: bool = False) -> str:
    name = "T" if terminals else "r"
    return (
        f"start: {name}0\n"
        + "".join(f'{name}{i}: "x" {name}{i + 1}\n' for i in range(n))
        + f'{name}{n}: "y"\n'
    )


def ref_chain(n: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string", "maxLength": 4}
    return {"$ref": "#/$defs/d0", "$defs": defs}


# -- in a subprocess: what crashed the process -------------------------------------------------

_BOMBS = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, "tests")
    import httpx
    from test_grammar_bombs import gbnf_chain, lark_chain, ref_chain
    from engine.server import ServerOptions, start_server
    from engine.server.testing import FakeChatTemplate, make_fake_scheduler

    sched = make_fake_scheduler(n_slots=2, n_ctx=1024)
    handle = start_server(sched, port=0, options=ServerOptions(), chat_template=FakeChatTemplate())
    msgs = [{"role": "user", "content": "hi"}]
    rf = lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}
    bodies = [
        ("/completion", {"prompt": "x", "n_predict": 4, "grammar": gbnf_chain(5000)}),
        ("/completion", {"prompt": "x", "n_predict": 4, "grammar": lark_chain(5000)}),
        ("/completion", {"prompt": "x", "n_predict": 4, "grammar": lark_chain(5000, terminals=True)}),
        ("/completion", {"prompt": "x", "n_predict": 4, "json_schema": ref_chain(5000)}),
        ("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "response_format": rf(ref_chain(2000))}),
        ("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "response_format": rf(ref_chain(5000))}),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 4,
                           "text": {"format": {"type": "json_schema", "name": "x", "schema": ref_chain(5000)}}}),
        ("/completion", {"prompt": "x", "n_predict": 4, "grammar": gbnf_chain(9000)}),
        ("/completion", {"prompt": "x", "n_predict": 4, "grammar": gbnf_chain(12000)}),
        ("/completion", {"prompt": "x", "n_predict": 4, "grammar": lark_chain(12000)}),
    ]
    out = []
    with httpx.Client(base_url=handle.url, timeout=120) as c:
        for path, body in bodies:
            r = c.post(path, json=body)
            out.append([path, r.status_code, r.text[:200]])
        out.append(["/health", c.get("/health").status_code, ""])
    handle.stop()
    sched.stop()
    print(json.dumps(out))
""")


def test_grammar_bombs_never_kill_the_server():
    proc = subprocess.run(
        [sys.executable, "-c", _BOMBS], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, (
        f"the server process died ({proc.returncode}): {proc.stderr[-2000:]}"
    )
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for path, status, text in results[:-1]:
        assert status in (200, 400), (path, status, text)
        if status == 400:
            assert "error" in json.loads(text)
    assert [status for _, status, _ in results[-3:-1]] == [400, 400]  # past MAX_RULES
    assert "too many rules" in results[-2][2]
    assert results[-1][1] == 200


# -- bounds before the library ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, source, needle",
    [
        ("gbnf", 'root ::= "' + "x" * (MAX_GRAMMAR_CHARS + 1) + '"', "too large"),
        ("gbnf", 'root ::= "x"{1000000}', f"at most {MAX_REPETITION}"),
        ("gbnf", 'root ::= "x"{2,5000}', "repeats too often"),
        ("lark", 'start: "x"{3000}', "repeats too often"),
        ("regex", "x{1000000}", "repeats too often"),
        ("json_schema", {"type": "string", "pattern": "a{1,100000}"}, "repeats too often"),
    ],
)
def test_grammar_bounds_refuse_before_compiling(kind, source, needle):
    with pytest.raises(GrammarError) as e:
        compile_grammar(kind, source)
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "kind, source, needle",
    [
        ("gbnf", gbnf_chain(MAX_RULES + 1), "too many rules"),
        ("lark", lark_chain(MAX_RULES + 1), "too many rules"),
        ("json_schema", json.dumps(ref_chain(20000)), "too large"),
    ],
)
def test_grammar_bounds_refuse_chains(kind, source, needle):
    # check_source alone: were the bound gone, compiling these chains in the runner's
    # process could kill it (the HTTP path is pinned in the subprocess above)
    with pytest.raises(GrammarError) as e:
        check_source(kind, source)
    assert needle in str(e.value)


def test_grammar_bounds_admit_what_llama_cpp_admits():
    check_source("gbnf", 'root ::= "x"{2000} "{9999}"')  # a literal is no repetition
    check_source("lark", '%llguidance {}\nstart: %json {"type": "string"}')
    g = compile_grammar("gbnf", gbnf_chain(3000))
    g.check_vocabulary(TOK)


def test_grammar_gbnf_chain_converts_to_a_terminal_chain():
    lark = gbnf_to_lark(gbnf_chain(3))
    # the whole chain is regular: every rule but the root becomes an upper-case terminal
    assert "start: R0_1" in lark and 'R3_4: "y"' in lark
    recursive = gbnf_to_lark('root ::= a\na ::= "x" a | "y"\n')
    assert "start: a_1" in recursive and "a_1: " in recursive  # on a cycle: stays a rule


# -- at request time, not after the first token --------------------------------------------------

EXPLODING = (
    "root ::= ("
    + " | ".join(f'"a" x{i}' for i in range(2500))
    + ")\n"
    + "".join(f'x{i} ::= "b" x{i} | "c"\n' for i in range(2500))
)


def test_grammar_that_fails_after_its_first_token_is_refused_up_front():
    g = compile_grammar("gbnf", EXPLODING)  # compiles: the rows explode only once it runs
    with pytest.raises(GrammarError) as e:
        g.check_vocabulary(TOK)
    assert "first token" in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def client():
    sched = make_fake_scheduler(n_slots=1, n_ctx=256)
    handle = start_server(sched, port=0, options=ServerOptions(), chat_template=FakeChatTemplate())
    with httpx.Client(base_url=handle.url, timeout=60) as c:
        yield c
    handle.stop()
    sched.stop()


@pytest.mark.parametrize(
    "body",
    [
        {"grammar": EXPLODING},
        {"grammar": 'root ::= "x"{1000000}'},
        {"grammar": 'root ::= "' + "x" * (1 << 20) + '"'},
        {"json_schema": {"type": "string", "pattern": "[a-z]{100000}"}},
    ],
    ids=["rows", "repetition", "literal", "pattern"],
)
def test_grammar_costly_grammars_are_a_400_at_request_time(client, body):
    r = client.post("/completion", json={"prompt": "x", "n_predict": 4, **body})
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert client.get("/health").status_code == 200
