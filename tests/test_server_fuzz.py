"""Fuzz the JSON endpoints with hypothesis: no input may produce a 5xx."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.server import ServerOptions, start_server
from engine.server.testing import FakeChatTemplate, make_fake_scheduler

ENDPOINTS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/completion",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/v1/embeddings",
    "/embedding",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
        "content": st.one_of(st.text(max_size=30), values),
    }
)
KNOWN = {
    "messages": st.one_of(st.lists(message, max_size=3), values),
    "prompt": st.one_of(
        st.text(max_size=30),
        st.lists(st.one_of(st.integers(-5, 400), st.text(max_size=5)), max_size=5),
        values,
    ),
    "max_tokens": st.one_of(st.integers(-3, 6), values),
    "n_predict": st.one_of(st.integers(-3, 6), values),
    "temperature": st.one_of(st.floats(-1, 3), values),
    "top_k": st.one_of(st.integers(-2, 300), values),
    "top_p": st.one_of(st.floats(-1, 2), values),
    "stop": st.one_of(st.text(max_size=3), values),
    "logit_bias": st.one_of(st.dictionaries(st.text(max_size=4), st.floats(-200, 200)), values),
    "n_probs": st.one_of(st.integers(-1, 200), values),
    "seed": st.one_of(st.integers(-5, 2**65), values),
    "stream": st.booleans(),
    "content": st.one_of(st.text(max_size=20), values),
    "tokens": st.one_of(st.lists(st.integers(-5, 2**40), max_size=5), values),
    "input": st.one_of(st.text(max_size=20), st.lists(st.integers(-3, 300), max_size=4), values),
    "logprobs": values,
    "top_logprobs": values,
    "with_pieces": values,
}
bodies = st.dictionaries(st.sampled_from(sorted(KNOWN)), st.none(), max_size=6).flatmap(
    lambda keys: st.fixed_dictionaries({k: KNOWN[k] for k in keys})
)


@pytest.fixture(scope="module")
def url():  # a client bound to the server's URL
    sched = make_fake_scheduler(n_slots=2, n_ctx=512)
    handle = start_server(
        sched,
        port=0,
        chat_template=FakeChatTemplate(),
        options=ServerOptions(embeddings=True, n_predict=8),
    )
    with httpx.Client(base_url=handle.url, timeout=10) as c:
        yield c
    handle.stop()
    sched.stop()


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(endpoint=st.sampled_from(ENDPOINTS), body=st.one_of(bodies, values))
def test_server_fuzz_no_5xx(url, endpoint, body):
    r = url.post(endpoint, json=body)
    assert r.status_code < 500, (endpoint, body, r.text)
    if r.status_code >= 400:
        assert set(r.json()["error"]) >= {"code", "message", "type"}


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(endpoint=st.sampled_from(ENDPOINTS), raw=st.binary(max_size=64))
def test_server_fuzz_raw_bytes_no_5xx(url, endpoint, raw):
    r = url.post(endpoint, content=raw)
    assert r.status_code < 500, (endpoint, raw, r.text)


# JSON text a client library would not write: lone surrogate escapes, NaN/Infinity, numbers
# past a double, deep nesting (json.dumps writes the first two when asked).
odd_scalars = st.one_of(
    scalars, st.floats(), st.text(alphabet=st.characters(categories=["Cs", "Ll"]), max_size=6)
)
odd_values = st.recursive(
    odd_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
extras = st.tuples(
    st.sampled_from(
        ["model", "prompt", "content", "stop", "input", "messages", "metadata", "tools"]
    ),
    st.sampled_from(
        [
            "1e999",
            "-1e400",
            '"\\udc00"',
            '["a\\ud800"]',
            "[" * 600 + "]" * 600,
            "[" * 5000 + "]" * 5000,
        ]
    ),
)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    extra=extras,
    body=st.dictionaries(st.sampled_from(sorted(KNOWN)), odd_values, max_size=4),
)
def test_server_fuzz_odd_json_no_5xx(url, endpoint, body, extra):
    key, value = extra
    body.pop(key, None)
    text = json.dumps(body, ensure_ascii=True)  # surrogates become \udXXX escapes
    text = text[:-1] + (", " if body else "") + f'"{key}": {value}}}'
    r = url.post(endpoint, content=text.encode(), headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (endpoint, text[:300], r.text)
