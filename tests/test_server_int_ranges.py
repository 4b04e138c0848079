"""Integer fields past 64 bits (issue 32): a 400 naming the field, on a tiny real model, where
`min_keep` above int64 was an OverflowError (a 500) in the sampler."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from pydantic import ValidationError

from engine.context import Context, ContextParams
from engine.model import load_model
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import SequenceGenerator
from engine.server import start_server
from engine.server.schemas import ChatCompletionRequest, CompletionRequest
from engine.server.testing import N_VOCAB, FakeTokenizer

INT_FIELDS = [
    name
    for name, f in CompletionRequest.model_fields.items()
    if "int" in str(f.annotation) and "float" not in str(f.annotation)
]


@pytest.fixture(scope="module")
def client(tiny_llama_path):
    model = load_model(tiny_llama_path)
    sched = Scheduler(
        Context(model, ContextParams(n_ctx=128, n_seq_max=1)), model.tokenizer, model=model
    ).start()
    handle = start_server(sched, port=0)
    with httpx.Client(base_url=handle.url, timeout=60) as c:
        yield c
    handle.stop()
    sched.stop()


@pytest.mark.parametrize(
    "path, body",
    [
        ("/completion", {"prompt": "hi", "n_predict": 2}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        ),
    ],
)
@pytest.mark.parametrize("value", [2**64, -(2**70)])
def test_int_fields_past_int64_are_a_400(client, path, body, value):
    r = client.post(path, json={**body, "min_keep": value, "temperature": 1.0, "top_p": 0.5})
    assert r.status_code == 400, r.text
    assert "min_keep" in r.json()["error"]["message"]


@pytest.mark.parametrize("name", INT_FIELDS)
def test_int_fields_every_one_is_bounded(name):
    with pytest.raises(ValidationError, match=name):
        CompletionRequest(prompt="x", **{name: 2**64 + 1})
    ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}], seed=2**64 - 1
    )  # a u64 seed


@pytest.mark.parametrize("kw", [{"top_p": 0.5}, {"min_p": 0.2}, {"typical_p": 0.5}, {}])
def test_int_fields_int64_max_min_keep_samples(kw):
    gen = SequenceGenerator(
        FakeTokenizer(), SamplingParams(temperature=1.0, min_keep=2**63 - 1, seed=1, **kw), 3
    )
    rng = np.random.default_rng(0)
    while not gen.finished:
        gen.accept(rng.normal(0, 3, N_VOCAB).astype(np.float32))
    assert len(gen.tokens) == 3
