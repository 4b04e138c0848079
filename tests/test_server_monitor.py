"""/metrics, /slots, /v1/models and /props as llama-server shapes them, over the fake scheduler."""

from __future__ import annotations

import json

import httpx
import pytest

from engine.server import ServerOptions, start_server
from engine.server.testing import FakeChatTemplate, make_fake_scheduler

COUNTERS = [
    "prompt_tokens_total",
    "prompt_tokens_cached_total",
    "prompt_seconds_total",
    "tokens_predicted_total",
    "tokens_predicted_seconds_total",
    "n_decode_total",
    "n_tokens_max",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
    "spec_decode_num_drafts_total",
]
GAUGES = [
    "prompt_tokens_seconds",
    "predicted_tokens_seconds",
    "requests_processing",
    "requests_deferred",
    "n_busy_slots_per_decode",
]


@pytest.fixture
def server():
    sched = make_fake_scheduler(n_slots=1, n_ctx=256)
    opts = ServerOptions(
        metrics=True, embeddings=True, alias="zeta, alpha,beta,alpha", model_tags=("chat", "small")
    )
    handle = start_server(sched, port=0, options=opts, chat_template=FakeChatTemplate())
    yield handle
    handle.stop()
    sched.stop()


def metrics(url: str) -> dict[str, tuple[str, float]]:
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith(
        "text/plain; version=0.0.4"
    )
    assert int(r.headers["process-start-time-unix"]) > 1_600_000_000
    types, out = {}, {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line.startswith("llamacpp:"):
            name, value = line.split(" ")
            assert f"# HELP {name} " in r.text
            out[name.removeprefix("llamacpp:")] = (types[name], float(value))
    return out


def test_every_llama_server_metric_with_its_type(server):
    m = metrics(server.url)
    assert {k: v[0] for k, v in m.items()} == {
        **dict.fromkeys(COUNTERS, "counter"),
        **dict.fromkeys(GAUGES, "gauge"),
    }


def test_prompt_tokens_processed_and_cached_are_counted_apart(server):
    n_processed = n_cached = n_predicted = 0
    for _ in range(2):
        t = httpx.post(
            server.url + "/completion", json={"prompt": "the quick brown fox", "n_predict": 4}
        ).json()
        n_processed += t["timings"]["prompt_n"]
        n_cached += t["timings"]["cache_n"]
        n_predicted += t["timings"]["predicted_n"]
    assert n_cached > 0
    m = metrics(server.url)
    assert m["prompt_tokens_total"][1] == n_processed
    assert m["prompt_tokens_cached_total"][1] == n_cached
    assert m["tokens_predicted_total"][1] == n_predicted
    assert m["n_tokens_max"][1] >= len("the quick brown fox") + 1
    assert m["requests_processing"][1] == 0


def test_embedding_prompts_count(server):
    httpx.post(
        server.url + "/v1/embeddings", json={"input": ["hello world", "goodbye world"]}
    ).raise_for_status()
    m = metrics(server.url)
    assert m["prompt_tokens_total"][1] == 12 + 14 and m["n_decode_total"][1] >= 2
    assert m["tokens_predicted_total"][1] == 0 and m["n_busy_slots_per_decode"][1] == 1


def test_throughput_gauges_cover_the_time_since_the_last_scrape(server):
    httpx.post(
        server.url + "/completion", json={"prompt": "abc", "n_predict": 4}
    ).raise_for_status()
    assert metrics(server.url)["prompt_tokens_seconds"][1] > 0
    assert metrics(server.url)["prompt_tokens_seconds"][1] == 0  # nothing since


def test_slots_hide_task_fields_until_a_slot_ran_one(server):
    fresh = httpx.get(server.url + "/slots").json()
    assert fresh == [{"id": 0, "n_ctx": 256, "speculative": False, "is_processing": False}]
    httpx.post(
        server.url + "/completion", json={"prompt": "abc", "n_predict": 3, "temperature": 0.5}
    ).json()
    slot = httpx.get(server.url + "/slots").json()[0]
    assert (
        slot["id_task"] >= 1
        and slot["n_prompt_tokens"] == 4
        and slot["params"]["temperature"] == 0.5
    )
    assert slot["next_token"] == [
        {"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}
    ]
    assert "prompt" not in slot and "generated" not in slot


def test_slots_fail_on_no_slot_takes_any_value(server):
    assert httpx.get(server.url + "/slots?fail_on_no_slot=true").status_code == 200


def test_models_list_aliases_and_tags(server):
    model = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert model["id"] == "alpha"  # the first alias in sorted order, as llama-server's std::set
    assert model["aliases"] == ["alpha", "beta", "zeta"] and model["tags"] == ["chat", "small"]
    assert model["meta"]["n_ctx"] == 256
    props = httpx.get(server.url + "/props").json()
    assert props["model_alias"] == "alpha" and props["endpoint_metrics"] is True
    assert props["cors_proxy_enabled"] is False


def test_progress_reports_carry_prompt_timings(server):
    body = {
        "prompt": "x" * 150,
        "n_predict": 2,
        "stream": True,
        "timings_per_token": True,
        "return_progress": True,
    }
    with httpx.stream("POST", server.url + "/completion", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    progress = [c for c in chunks if "prompt_progress" in c]
    assert len(progress) > 1  # 151 tokens in batches of 64
    first = progress[0]["timings"]
    assert first["prompt_n"] == 0 and first["prompt_ms"] == 0.0 and first["predicted_n"] == 0
    prompt_ms = [c["timings"]["prompt_ms"] for c in progress]
    assert prompt_ms == sorted(prompt_ms) and prompt_ms[-1] > 0
    assert progress[-1]["timings"]["prompt_n"] == 151
