"""llama-server's request shapes and reply details on the generation endpoints, over the fake
scheduler: several prompts and choices, prompt objects, logit_bias forms, generation_settings,
system_fingerprint, response_fields, assistant prefill, __verbose, timings_per_token."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from engine.sampling import DEFAULT_SAMPLERS, sampler_names
from engine.server import ServerOptions, start_server
from engine.server.testing import EOS, FakeChatTemplate, FakeTokenizer, make_fake_scheduler

TOK = FakeTokenizer()


@pytest.fixture(scope="module")
def server():
    sched = make_fake_scheduler(n_slots=2, n_ctx=512, delay_s=0.001)
    handle = start_server(
        sched, port=0, options=ServerOptions(alias="fake"), chat_template=FakeChatTemplate()
    )
    yield handle
    handle.stop()
    sched.stop()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def events(text: str) -> list:
    return [
        json.loads(line[6:])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def ok(r) -> dict | list:
    assert r.status_code == 200, r.text
    return r.json()


def bad(r, needle: str) -> str:
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert needle.lower() in msg.lower(), msg
    return msg


def complete(client, **body):
    return client.post("/completion", json={"n_predict": 3, "temperature": 0, **body})


# -- prompts ---------------------------------------------------------------------------------


def test_several_prompts_give_a_list_of_results(client):
    ids = TOK.encode("ab")
    res = ok(complete(client, prompt=[ids, "ab", {"prompt_string": "ab"}]))
    assert isinstance(res, list) and [r["index"] for r in res] == [0, 1, 2]
    assert len({r["content"] for r in res}) == 1


def test_one_prompt_is_one_object(client):
    for prompt in ("ab", TOK.encode("ab"), ["ab"], {"prompt_string": "ab"}, [1, 2, "x", 70]):
        res = ok(complete(client, prompt=prompt))
        assert isinstance(res, dict) and res["content"], prompt


def test_mixed_prompt_adds_special_tokens_only_for_leading_text(client):
    one = ok(client.post("/completion", json={"prompt": ["ab", 70], "n_predict": 1}))
    two = ok(client.post("/completion", json={"prompt": [70, "ab"], "n_predict": 1}))
    assert one["tokens_evaluated"] == 4 and two["tokens_evaluated"] == 3  # BOS + a b + 70; 70 + a b


@pytest.mark.parametrize(
    "prompt,needle",
    [
        ({"prompt_string": "x", "multimodal_data": ["aGk="]}, "multimodal"),
        ({"text": "x"}, "prompt_string"),
        ([], "empty"),
        ([{"prompt_string": 5}], "prompt_string"),
        ([[1.5]], "prompt"),
    ],
)
def test_bad_prompts_are_400(client, prompt, needle):
    bad(complete(client, prompt=prompt), needle)


def test_openai_completions_with_several_prompts_merge_choices(client):
    res = ok(client.post("/v1/completions", json={"prompt": ["ab", "cd"], "max_tokens": 2}))
    assert [c["index"] for c in res["choices"]] == [0, 1]
    assert res["system_fingerprint"].startswith("b")


# -- choices ----------------------------------------------------------------------------------


def test_chat_n_choices_share_one_reply(client):
    res = ok(
        client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "hi"}],
                "n": 2,
                "max_tokens": 3,
                "id_slot": 0,
            },
        )
    )
    assert [c["index"] for c in res["choices"]] == [0, 1]
    assert all(c["finish_reason"] == "length" for c in res["choices"])
    assert re.fullmatch(r"chatcmpl-\w+", res["id"])


def test_more_choices_than_slots_is_400(client):
    bad(
        client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "n": 3}
        ),
        "'n'",
    )


def test_stream_with_two_choices_interleaves_indexes(client):
    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "n": 2,
            "max_tokens": 3,
            "stream": True,
        },
    )
    evs = events(r.text)
    finished = {
        e["choices"][0]["index"] for e in evs if e["choices"] and e["choices"][0]["finish_reason"]
    }
    assert finished == {0, 1}
    assert len({e["id"] for e in evs}) == 1
    assert r.text.rstrip().endswith("data: [DONE]")


def test_native_stream_with_two_prompts_ends_each(client):
    r = client.post("/completion", json={"prompt": ["ab", "cd"], "n_predict": 2, "stream": True})
    evs = events(r.text)
    assert sorted(e["index"] for e in evs if e["stop"]) == [0, 1]


# -- logit bias -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bias",
    [
        [["b", False]],
        [[TOK.encode("b", add_special=False)[0], False]],
        {"b": False},
        {str(TOK.encode("b", add_special=False)[0]): -100},
    ],
)
def test_logit_bias_forms_ban_the_token(client, bias):
    # the fake model's next token after "a" is "b"; banned, something else comes
    base = ok(complete(client, prompt="a", n_predict=1))["content"]
    res = ok(complete(client, prompt="a", n_predict=1, logit_bias=bias))
    assert base == "b" and res["content"] != "b"
    entries = res["generation_settings"]["logit_bias"]
    assert entries and all(set(e) == {"bias", "token"} for e in entries)


@pytest.mark.parametrize(
    "bias,needle",
    [
        ([["a"]], "pairs"),
        ([["a", "x"]], "finite"),
        ({"a": True}, "finite"),
        (5, "logit_bias"),
        ([[10**9, 1]], "out of range"),
    ],
)
def test_bad_logit_bias_is_400(client, bias, needle):
    bad(complete(client, prompt="a", logit_bias=bias), needle)


# -- generation_settings ---------------------------------------------------------------------


def test_generation_settings_has_llama_server_keys(client):
    gs = ok(complete(client, prompt="a", mirostat=2, dry_multiplier=0.5, samplers="kt"))[
        "generation_settings"
    ]
    for key in (
        "seed",
        "temperature",
        "dynatemp_range",
        "top_n_sigma",
        "xtc_probability",
        "xtc_threshold",
        "dry_multiplier",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "dry_sequence_breakers",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "adaptive_target",
        "adaptive_decay",
        "stop",
        "max_tokens",
        "n_predict",
        "n_keep",
        "n_discard",
        "ignore_eos",
        "stream",
        "logit_bias",
        "n_probs",
        "min_keep",
        "grammar",
        "samplers",
        "timings_per_token",
        "post_sampling_probs",
        "backend_sampling",
        "lora",
        "speculative.types",
    ):
        assert key in gs, key
    assert (
        gs["mirostat"] == 2
        and gs["dry_multiplier"] == 0.5
        and gs["samplers"] == ["top_k", "temperature"]
    )
    assert gs["n_predict"] == gs["max_tokens"] == 3 and gs["logit_bias"] == []
    assert gs["seed"] == 0xFFFFFFFF  # the default, a random seed, as llama.cpp reports it


def test_ignore_eos_reports_the_eog_bans(client):
    gs = ok(complete(client, prompt="a", ignore_eos=True))["generation_settings"]
    assert {"bias": None, "token": EOS} in gs["logit_bias"]


def test_sampler_names():
    assert sampler_names(None) == DEFAULT_SAMPLERS
    assert sampler_names(["Top-K", "minp", "nucleus", "bogus"]) == ("top_k", "min_p", "top_p")
    assert sampler_names("ekq") == ("penalties", "top_k")


def test_response_fields_pick_nested_values(client):
    res = ok(
        complete(
            client,
            prompt="ab",
            response_fields=["content", "generation_settings/n_predict", "prompt", "nope/x"],
        )
    )
    assert set(res) == {"content", "generation_settings/n_predict", "prompt"}
    assert res["generation_settings/n_predict"] == 3 and res["prompt"] == "ab"


def test_system_fingerprint_is_a_build(client):
    res = ok(
        client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
        )
    )
    assert re.fullmatch(r"b[\w.+]+-\w+", res["system_fingerprint"])


# -- chat ------------------------------------------------------------------------------------


def prompt_of(client, messages, **kw) -> str:
    res = ok(
        client.post(
            "/v1/chat/completions",
            json={"messages": messages, "max_tokens": 1, "verbose": True, **kw},
        )
    )
    return res["__verbose"]["prompt"]


def test_final_assistant_message_is_continued(client):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Wh"}]
    p = prompt_of(client, msgs)
    assert p.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nWh")
    assert prompt_of(client, msgs, continue_final_message=True, add_generation_prompt=False) == p
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    assert prompt_of(client, [msgs[0], {"role": "assistant", "content": parts}]).endswith(
        "assistant\nWh\n\nill"
    )


@pytest.mark.parametrize(
    "messages,extra,needle",
    [
        (
            [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "a"},
                {"role": "assistant", "content": "b"},
            ],
            {},
            "2 or more assistant",
        ),
        (
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"}],
            {"continue_final_message": True, "add_generation_prompt": True},
            "both",
        ),
        ([{"role": "user"}], {}, "content"),
        ([{"role": "user", "content": "x"}], {"top_logprobs": 2}, "logprobs"),
    ],
)
def test_bad_chats_are_400(client, messages, extra, needle):
    bad(client.post("/v1/chat/completions", json={"messages": messages, **extra}), needle)


def test_verbose_is_per_request(client):
    body = {"messages": [{"role": "user", "content": "Book"}], "max_tokens": 2}
    assert "__verbose" not in ok(client.post("/v1/chat/completions", json=body))
    v = ok(client.post("/v1/chat/completions", json={**body, "verbose": True}))["__verbose"]
    assert "Book" in v["prompt"] and v["stop"] is True and "generation_settings" in v


def test_chat_input_tokens(client):
    body = {"messages": [{"role": "user", "content": "abc"}]}
    res = ok(client.post("/v1/chat/completions/input_tokens", json=body))
    assert res["input_tokens"] == len(
        TOK.encode("<|im_start|>user\nabc<|im_end|>\n<|im_start|>assistant\n")
    )


def test_timings_per_token_in_stream(client):
    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
            "timings_per_token": True,
        },
    )
    evs = events(r.text)
    assert "timings" not in evs[0] and evs[0]["choices"][0]["delta"]["role"] == "assistant"
    assert (
        "timings" in evs[-1]
        and evs[-1]["choices"] == []
        and evs[-1]["usage"]["completion_tokens"] == 3
    )
    assert all(
        "timings" in e for e in evs[1:] if e["choices"] and e["choices"][0]["delta"].get("content")
    )


def test_any_text_is_a_template_with_jinja():
    from engine.errors import TemplateError
    from engine.tokenizer.chat_template import ChatTemplate

    t = ChatTemplate.from_gguf({}, override="This is not a template", any_text=True)
    assert t.render([{"role": "user", "content": "x"}]) == "This is not a template"
    with pytest.raises(TemplateError):
        ChatTemplate.from_gguf({}, override="This is not a template")


def test_server_verbose_adds_verbose_to_every_reply():
    sched = make_fake_scheduler(n_slots=1, n_ctx=256)
    handle = start_server(
        sched, port=0, options=ServerOptions(verbose=True), chat_template=FakeChatTemplate()
    )
    try:
        body = {"messages": [{"role": "user", "content": "Book"}], "max_tokens": 1}
        res = httpx.post(handle.url + "/v1/chat/completions", json=body, timeout=10).json()
        assert "Book" in res["__verbose"]["prompt"]
        res = httpx.post(
            handle.url + "/v1/chat/completions", json={**body, "verbose": False}, timeout=10
        ).json()
        assert "__verbose" not in res
    finally:
        handle.stop()
        sched.stop()


# -- post-sampling probabilities -------------------------------------------------------------


def test_post_sampling_probs_replace_logprobs(client):
    res = ok(complete(client, prompt="a", n_probs=3, temperature=1.0, post_sampling_probs=True))
    assert res["generation_settings"]["post_sampling_probs"] is True
    for tok in res["completion_probabilities"]:
        assert 0 < tok["prob"] <= 1 and "logprob" not in tok and "top_logprobs" not in tok
        probs = [p["prob"] for p in tok["top_probs"]]
        assert probs and probs == sorted(probs, reverse=True) and all(0 < p <= 1 for p in probs)
        assert tok["id"] == tok["top_probs"][0]["id"]  # the fake model's one likely token


def test_candidate_probs():
    import numpy as np

    from engine.sampling import Candidates, candidate_probs

    c = Candidates(np.array([7, 3, 9]), np.array([0.0, np.log(3.0), -np.inf], np.float32), False)
    prob, top = candidate_probs(c, 5, 7)
    assert prob == pytest.approx(0.25) and [t for t, _ in top] == [3, 7]
    assert sum(p for _, p in top) == pytest.approx(1.0)
    assert candidate_probs(c, 1, 3)[1] == ((3, pytest.approx(0.75)),)


# -- prompt progress -------------------------------------------------------------------------


def progress_of(client, path: str, body: dict) -> list[dict]:
    r = client.post(path, json={**body, "stream": True, "return_progress": True})
    return [e["prompt_progress"] for e in events(r.text) if "prompt_progress" in e]


@pytest.mark.parametrize(
    "path,body",
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "q" * 150}], "max_tokens": 2},
        ),
        ("/completion", {"prompt": "p" * 150, "n_predict": 2}),
    ],
)
def test_return_progress_reports_each_prompt_chunk(client, path, body):
    first = progress_of(client, path, body)
    done = [
        p["processed"] for p in first
    ]  # the start, then after each chunk of at most n_batch (64)
    total, cache = first[0]["total"], first[0]["cache"]  # earlier requests may have cached a prefix
    assert len(first) >= 1 + -(-(total - cache) // 64) and {
        (p["total"], p["cache"]) for p in first
    } == {(total, cache)}
    assert done[0] == cache < total - 64 and done[-1] == total
    assert all(0 < b - a <= 64 for a, b in zip(done, done[1:], strict=False))
    again = progress_of(client, path, body)  # the prompt is cached now: one chunk of one token
    assert len(again) == 2 and again[0]["cache"] == again[0]["processed"] == again[0]["total"] - 1


def test_no_prefill_assistant_takes_the_last_message_whole():
    from engine.cli import build_parser, parse_args

    assert (
        parse_args(
            build_parser(), ["serve", "-m", "x.gguf", "--no-prefill-assistant"]
        ).prefill_assistant
        is False
    )
    assert parse_args(build_parser(), ["serve", "-m", "x.gguf"]).prefill_assistant is True
    sched = make_fake_scheduler(n_slots=1, n_ctx=256)
    handle = start_server(
        sched,
        port=0,
        options=ServerOptions(prefill_assistant=False, verbose=True),
        chat_template=FakeChatTemplate(),
    )
    try:
        msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Wh"}]
        res = httpx.post(
            handle.url + "/v1/chat/completions",
            json={"messages": msgs, "max_tokens": 1},
            timeout=10,
        )
        assert res.json()["__verbose"]["prompt"].endswith(
            "assistant\nWh<|im_end|>\n<|im_start|>assistant\n"
        )
    finally:
        handle.stop()
        sched.stop()


def test_no_jinja_renders_the_builtin_format_the_template_matches():
    from types import SimpleNamespace

    from engine.params import CommonParams
    from engine.server.startup import chat_template as _chat_template

    src = (
        "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nDefault<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    model = SimpleNamespace(gguf={"tokenizer.chat_template": src})
    msgs = [{"role": "user", "content": "hi"}]
    p = CommonParams(use_jinja=False)
    assert (
        _chat_template(p, model).render(msgs)
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (
        _chat_template(CommonParams(), model).render(msgs).startswith("<|im_start|>system\nDefault")
    )


def test_extra_sampler_fields_reach_the_chain(client):
    body = {
        "top_n_sigma": 1.5,
        "xtc_probability": 0.25,
        "xtc_threshold": 0.2,
        "dynatemp_range": 0.3,
        "dynatemp_exponent": 2.0,
        "samplers": "kt",
    }
    gs = ok(complete(client, prompt="hi", **body))["generation_settings"]
    assert {k: gs[k] for k in body if k != "samplers"} == {
        k: v for k, v in body.items() if k != "samplers"
    }
    assert gs["samplers"] == ["top_k", "temperature"]
