"""engine/grammar.py: grammars as token masks, on fake and tiny-GGUF vocabularies.

Random logits stand in for a model: whatever the logits say, the output must match the
grammar, and when the grammar is complete the sequence must end.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.errors import EngineError, GrammarError, InvalidRequestError
from engine.grammar import (
    Grammar,
    GrammarMatcher,
    close_objects,
    compile_grammar,
    token_bytes,
    vocabulary_for,
)
from engine.sampling import SamplingParams
from engine.scheduler import GenerationRequest
from engine.sequence import SequenceGenerator
from engine.server.testing import EOS, N_SPECIAL, N_VOCAB, FakeTokenizer, make_fake_scheduler

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
TOK = FakeTokenizer()  # one token per byte (id = byte + 3), 0 <unk>, 1 <s>, 2 </s> = EOS

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def run(grammar: Grammar, params=GREEDY, n_predict=80, seed=0, n_vocab=N_VOCAB, tokenizer=TOK):
    """Generate from random logits under `grammar`: (text, steps)."""
    rng = np.random.default_rng(seed)
    gen = SequenceGenerator(tokenizer, params, n_predict, grammar=grammar)
    steps = []
    while not gen.finished:
        steps.append(gen.accept(rng.normal(0, 3, n_vocab).astype(np.float32)))
    return gen.text, steps


# -- building grammars --------------------------------------------------------------------


def test_grammar_gbnf_repetition_forces_exact_output():
    g = Grammar.from_gbnf('root ::= "a"{5}')
    for params in (GREEDY, SAMPLED):
        for seed in range(3):
            text, steps = run(g, params, seed=seed)
            assert text == "aaaaa"
            assert steps[-1].finish_reason == "stop" and steps[-1].token == EOS
            assert len(steps) == 6  # five "a", then the end-of-generation token


def test_grammar_alternatives_and_classes():
    g = Grammar.from_gbnf('root ::= ("yes" | "no") " " [0-9]{2,3} "."')
    for seed in range(5):
        text, _ = run(g, SAMPLED, seed=seed)
        head, num = text[:-1].split(" ")
        assert head in ("yes", "no") and num.isdigit() and 2 <= len(num) <= 3 and text.endswith(".")


def test_grammar_lark_text_is_accepted():
    text, _ = run(Grammar.from_gbnf('start: "x" "y"'))
    assert text == "xy"
    g = Grammar.from_gbnf('%llguidance {}\nstart: "x" "z"')  # llama.cpp's marker
    assert g.kind == "lark" and run(g)[0] == "xz"


@pytest.mark.parametrize(
    "source, out",
    [
        ('root ::= start\nstart ::= "a"', "a"),  # GBNF with a rule named start is not Lark
        ('start ::= "b"\nroot ::= start "c"', "bc"),
        (
            'root ::= a-b aB a_b\na-b ::= "x"\naB ::= "y"\na_b ::= "z"',
            "xyz",
        ),  # names that fold alike
        ('root ::= 1x\n1x ::= "q"', "q"),
    ],
)
def test_grammar_gbnf_rule_names_llguidance_would_clash_on(source, out):
    g = Grammar.from_gbnf(source)
    assert g.kind == "gbnf" and run(g)[0] == out


# GBNF features llama.cpp's grammars use: comments, escapes, negated and ranged classes,
# {m,n} repetition, optional groups, alternation over lines, recursion
LIST_GBNF = r"""
# a bracketed list of signed numbers or quoted words
root   ::= "[" ws ( item ( "," ws item ){0,4} )? "]"
item   ::= number | word
number ::= "-"? [1-9] [0-9]{0,3}
word   ::= "\"" [^"\\\x00-\x1f]{1,6} "\""
ws     ::= [ \t\n]?
"""


def test_grammar_gbnf_features_compile_and_hold():
    import re

    g = Grammar.from_gbnf(LIST_GBNF)
    item = r'(-?[1-9][0-9]{0,3}|"[^"\\\x00-\x1f]{1,6}")'
    pattern = re.compile(rf"\[\s?({item}(,\s?{item}){{0,4}})?\]")
    for seed in range(6):
        text, steps = run(g, SAMPLED, n_predict=120, seed=seed)
        assert steps[-1].finish_reason == "stop" and pattern.fullmatch(text), text


def test_grammar_json_schema_output_parses_and_validates():
    g = Grammar.from_json_schema(PERSON)
    for seed in range(4):
        text, steps = run(g, SAMPLED, n_predict=200, seed=seed)
        assert steps[-1].finish_reason == "stop", text
        obj = json.loads(text)
        assert set(obj) == {"name", "age"}
        assert isinstance(obj["name"], str) and len(obj["name"]) <= 8
        assert isinstance(obj["age"], int)


def test_grammar_json_schema_from_text_and_empty_schema():
    assert Grammar.from_json_schema('{"const": "42"}').kind == "json_schema"
    text, _ = run(Grammar.from_json_schema('{"const": "42"}'))
    assert text == '"42"'
    text, _ = run(Grammar.from_json_schema({"type": "object"}), SAMPLED, n_predict=200, seed=3)
    assert isinstance(json.loads(text), dict)


def test_grammar_json_whitespace_is_bounded():
    """llama.cpp's rule: one space, or one or two newlines and up to 20 spaces/tabs."""
    vocab = vocabulary_for(TOK)
    m = GrammarMatcher(
        Grammar.from_json_schema({"type": "array", "items": {"type": "integer"}}), TOK
    )
    assert m.accept(N_SPECIAL + ord("["))
    assert m.accept(N_SPECIAL + ord("\n"))
    for _ in range(20):
        assert m.accept(N_SPECIAL + ord(" "))
    assert not m.allowed()[N_SPECIAL + ord(" ")]
    assert vocab is vocabulary_for(TOK)


@pytest.mark.parametrize(
    "kind, source, needle",
    [
        ("gbnf", "root ::= this is (not valid GBNF", "failed to parse grammar"),
        ("gbnf", 'foo ::= "a"', "root"),
        ("gbnf", "root ::= undefined-rule", "undefined-rule"),
        ("json_schema", {"type": "hiccup"}, "hiccup"),
        ("json_schema", {"type": 123}, "type"),
        ("json_schema", 123, "object or a boolean"),
        ("json_schema", "{not json", "not valid JSON"),
        ("json_schema", {"type": "array", "minItems": 3, "maxItems": 1}, "minItems"),
        ("json_schema", {"type": "string", "pattern": "[a-"}, "regex"),
        ("regex", "(unclosed", "invalid regex"),
        ("yaml", "a: b", "unknown grammar kind"),
    ],
)
def test_grammar_invalid_is_a_clear_error(kind, source, needle):
    with pytest.raises(GrammarError) as e:
        compile_grammar(kind, source)
    assert needle in str(e.value)
    assert isinstance(e.value, InvalidRequestError)  # the server maps it to a 400


def test_grammar_listed_properties_close_the_object():
    """llama.cpp's reading: no additionalProperties + properties = no other keys."""
    schema = {
        "type": "object",
        "properties": {"properties": {"type": "object", "properties": {"x": {"const": 1}}}},
        "required": ["properties"],
        "$defs": {"d": {"properties": {}}},
        "anyOf": [{"properties": {}}],
        "items": [{"properties": {}}],
    }
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert set(closed["properties"]) == {"properties"}  # a property's name is not a keyword
    assert closed["properties"]["properties"]["additionalProperties"] is False
    assert closed["$defs"]["d"]["additionalProperties"] is False
    assert closed["anyOf"][0]["additionalProperties"] is False
    assert closed["items"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the caller's schema is left alone
    assert (
        close_objects({"properties": {}, "additionalProperties": True})["additionalProperties"]
        is True
    )
    nested = {
        "type": "object",
        "properties": {"properties": schema["properties"]["properties"]},
        "required": ["properties"],
    }
    for seed in range(3):
        text, _ = run(Grammar.from_json_schema(nested), SAMPLED, n_predict=200, seed=seed)
        assert json.loads(text) in ({"properties": {"x": 1}}, {"properties": {}})


def test_grammar_unimplemented_schema_keywords_are_ignored():
    """As llama.cpp's json-schema-to-grammar does (uniqueItems, not, ...)."""
    Grammar.from_json_schema({"type": "array", "uniqueItems": True, "items": {"type": "integer"}})


# -- the vocabulary -----------------------------------------------------------------------


def test_grammar_control_tokens_are_marked_special():
    pieces = token_bytes(TOK)
    assert pieces[EOS] == b"\xff</s>" and pieces[N_SPECIAL + ord("a")] == b"a"


def test_grammar_special_tokens_never_match_text(tiny_llama_path):
    from engine.gguf_file import GGUFFile
    from engine.tokenizer import load_tokenizer

    tok = load_tokenizer(GGUFFile(tiny_llama_path))
    im_end = tok.token_to_id["<|im_end|>"]
    assert token_bytes(tok)[im_end].startswith(b"\xff")
    m = GrammarMatcher(Grammar.from_gbnf('root ::= "<|im_end|>" " the"'), tok)
    allowed = m.allowed()
    assert not allowed[im_end] and allowed[tok.token_to_id["<"]]
    # multi-byte tokens of the BPE vocabulary are allowed where they fit
    for piece in "<|im_end|>":
        assert m.accept(tok.token_to_id[piece])
    assert m.allowed()[tok.token_to_id["Ġthe"]]


def test_grammar_padded_logits_rows_are_never_allowed():
    g = Grammar.from_gbnf("root ::= [a-z]+")
    rng = np.random.default_rng(1)
    gen = SequenceGenerator(TOK, SAMPLED, 20, grammar=g)
    for _ in range(20):
        logits = rng.normal(0, 1, N_VOCAB + 64).astype(np.float32)
        logits[N_VOCAB:] = 50.0  # padding rows the model would love to pick
        step = gen.accept(logits)
        assert step.token < N_VOCAB
        if step.finish_reason:
            break


# -- generation -----------------------------------------------------------------------------


def test_grammar_logprobs_are_those_of_the_raw_logits():
    """llama-server reports pre-sampling probabilities (post_sampling_probs off)."""
    logits = np.zeros(N_VOCAB, np.float32)
    logits[N_SPECIAL + ord("z")] = 5.0
    gen = SequenceGenerator(
        TOK,
        SamplingParams(temperature=0.0, n_probs=2),
        5,
        grammar=Grammar.from_gbnf('root ::= "a"'),
    )
    step = gen.accept(logits)
    assert step.token == N_SPECIAL + ord("a")
    lse = float(np.log(np.exp(logits.astype(np.float64)).sum()))
    assert step.logprob == pytest.approx(0.0 - lse, abs=1e-5)
    assert step.top_logprobs[0][0] == N_SPECIAL + ord("z")


def test_grammar_complete_ends_even_with_ignore_eos():
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    text, steps = run(Grammar.from_gbnf('root ::= "ab"'), params)
    assert text == "ab" and steps[-1].finish_reason == "stop" and len(steps) == 3


def test_grammar_token_limit_still_applies():
    gen = SequenceGenerator(TOK, GREEDY, 4, grammar=Grammar.from_gbnf("root ::= [a-z]+"))
    logits = np.arange(N_VOCAB, dtype=np.float32)  # EOS (2) never the most likely
    steps = [gen.accept(logits) for _ in range(4)]
    assert gen.text == "zzzz" and steps[-1].finish_reason == "length"


def test_grammar_matcher_rejects_forbidden_token():
    m = GrammarMatcher(Grammar.from_gbnf('root ::= "a"'), TOK)
    assert not m.accept(N_SPECIAL + ord("b"))
    assert m.error


def test_grammar_rejected_sample_is_an_engine_error():
    gen = SequenceGenerator(TOK, GREEDY, 5, grammar=Grammar.from_gbnf('root ::= "a"'))
    assert gen.matcher is not None
    gen.matcher.accept(N_SPECIAL + ord("b"))  # the matcher is now in its error state
    with pytest.raises(EngineError, match="grammar"):
        gen.accept(np.zeros(N_VOCAB, np.float32))


def test_grammar_through_the_scheduler_streams_only_grammar_text():
    sched = make_fake_scheduler(n_slots=2)
    try:
        g = Grammar.from_json_schema(PERSON)
        plain = GenerationRequest(TOK.encode("hello"), GREEDY, 12)
        constrained = GenerationRequest(TOK.encode("hello"), SAMPLED, 200, grammar=g)
        h1, h2 = sched.submit(plain), sched.submit(constrained)
        text2 = "".join(s.text_delta for s in h2)
        text1 = "".join(s.text_delta for s in h1)
        assert json.loads(text2)["age"] is not None
        assert text1 and not text1.startswith("{")  # the other slot is unconstrained
    finally:
        sched.stop()
