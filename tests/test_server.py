"""HTTP server over the fake scheduler: endpoints, shapes, errors, auth, streaming, cancel."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from engine.server import PortInUseError, ServerOptions, ServerState, listen, start_server
from engine.server.testing import FakeChatTemplate, FakeTokenizer, make_fake_scheduler

TOK = FakeTokenizer()


@pytest.fixture(scope="module")
def server():
    sched = make_fake_scheduler(n_slots=4, n_ctx=1024, delay_s=0.001)
    opts = ServerOptions(metrics=True, embeddings=True, alias="fake-alias")
    handle = start_server(sched, port=0, options=opts, chat_template=FakeChatTemplate())
    yield handle
    handle.stop()
    sched.stop()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def chat(content="abc", **kw):
    return {"messages": [{"role": "user", "content": content}], "temperature": 0, **kw}


def sse_events(text: str) -> list:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def assert_error(r, status, type_=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["message"]
    if type_:
        assert err["type"] == type_
    return err


# -- monitoring -----------------------------------------------------------------------


def test_server_health_models_props(client):
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/v1/health").status_code == 200
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "fake-alias"
    assert client.get("/models").status_code == 200
    props = client.get("/props").json()
    assert props["total_slots"] == 4
    assert props["default_generation_settings"]["n_ctx"] == 256


def test_server_slots_and_metrics(client):
    slots = client.get("/slots").json()
    assert len(slots) == 4 and {"id", "n_ctx", "is_processing"} <= slots[0].keys()
    client.post("/completion", json={"prompt": "abc", "n_predict": 3})
    text = client.get("/metrics").text
    assert "llamacpp:tokens_predicted_total" in text and "# TYPE" in text


def test_server_health_503_while_loading_then_200():
    state = ServerState(ServerOptions())
    handle = listen(state, "127.0.0.1", 0)
    try:
        r = httpx.get(handle.url + "/health")
        assert r.status_code == 503
        assert r.json() == {
            "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
        }
        assert httpx.post(handle.url + "/v1/chat/completions", json=chat()).status_code == 503
        sched = make_fake_scheduler()
        state.set_ready(sched, FakeChatTemplate())
        assert httpx.get(handle.url + "/health").status_code == 200
        sched.stop()
    finally:
        handle.stop()


# -- generation -----------------------------------------------------------------------


def test_server_chat_completion_shape(client):
    r = client.post("/v1/chat/completions", json=chat(max_tokens=5))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "abcde"}
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 5
    assert body["timings"]["predicted_n"] == 5
    assert (
        client.post("/chat/completions", json=chat(max_tokens=2)).json()["choices"][0]["message"][
            "content"
        ]
        == "ab"
    )


def test_server_chat_stream_with_usage(client):
    r = client.post(
        "/v1/chat/completions",
        json=chat(max_tokens=4, stream=True, stream_options={"include_usage": True}),
    )
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "abcd"
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finals[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_server_chat_stop_and_logprobs(client):
    body = client.post(
        "/v1/chat/completions", json=chat(max_tokens=10, stop=["d"], logprobs=True, top_logprobs=3)
    ).json()
    choice = body["choices"][0]
    assert choice["message"]["content"] == "abc" and choice["finish_reason"] == "stop"
    entries = choice["logprobs"]["content"]
    assert entries[0]["token"] == "a" and len(entries[0]["top_logprobs"]) == 3
    assert entries[0]["logprob"] <= 0
    plain = client.post("/v1/chat/completions", json=chat(max_tokens=2, logprobs=True)).json()
    assert [e["token"] for e in plain["choices"][0]["logprobs"]["content"]] == ["a", "b"]
    # logprobs without top_logprobs asks for no n_probs, yet each token's log-probability is computed
    assert all(-50 < e["logprob"] <= 0 for e in plain["choices"][0]["logprobs"]["content"])


def test_server_v1_completions(client):
    body = client.post(
        "/v1/completions", json={"prompt": "abc", "max_tokens": 3, "temperature": 0}
    ).json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "def"
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "def"


def test_server_native_completion(client):
    body = client.post(
        "/completion", json={"prompt": "abc", "n_predict": 4, "return_tokens": True, "n_probs": 2}
    ).json()
    assert body["content"] == "defg" and body["stop"] is True and body["stop_type"] == "limit"
    assert body["tokens"] == [t for t in TOK.encode("defg", add_special=False)]
    assert len(body["completion_probabilities"]) == 4
    assert {"prompt_n", "predicted_n", "cache_n"} <= body["timings"].keys()
    again = client.post("/completion", json={"prompt": "abc", "n_predict": 4}).json()
    assert again["timings"]["cache_n"] >= 3  # the prompt came from the cache
    ids = client.post(
        "/completion",
        json={"prompt": [1, *TOK.encode("ab", add_special=False), "c"], "n_predict": 2},
    ).json()
    assert ids["content"] == "de"
    stream = client.post("/completion", json={"prompt": "abc", "n_predict": 3, "stream": True}).text
    events = sse_events(stream)
    assert "[DONE]" not in events and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == "def"


def test_server_n_predict_zero(client):
    body = client.post("/completion", json={"prompt": "abc", "n_predict": 0}).json()
    assert body["content"] == "" and body["tokens_predicted"] == 0


def test_server_tokenize_detokenize_template(client):
    toks = client.post("/tokenize", json={"content": "hi"}).json()["tokens"]
    assert toks == TOK.encode("hi", add_special=False)
    pieces = client.post("/tokenize", json={"content": "hi", "with_pieces": True}).json()["tokens"]
    assert pieces[0] == {"id": toks[0], "piece": "h"}
    assert client.post("/detokenize", json={"tokens": toks}).json() == {"content": "hi"}
    prompt = client.post(
        "/apply-template", json={"messages": [{"role": "user", "content": "x"}]}
    ).json()
    assert prompt["prompt"].endswith("<|im_start|>assistant\n")


def test_server_embeddings(client):
    body = client.post("/v1/embeddings", json={"input": ["hello", "world"]}).json()
    assert len(body["data"]) == 2 and len(body["data"][0]["embedding"]) == 8
    assert body["usage"]["prompt_tokens"] == 12
    native = client.post("/embedding", json={"content": "hello"}).json()
    assert len(native[0]["embedding"]) == 1 and len(native[0]["embedding"][0]) == 8
    b64 = client.post("/v1/embeddings", json={"input": "hello", "encoding_format": "base64"}).json()
    assert isinstance(b64["data"][0]["embedding"], str)


# -- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, needle",
    [
        (b"{not json", "malformed JSON"),
        (b"[1, 2]", "JSON object"),
        (b"\xff\xfe{}", "UTF-8"),
        (b"", "empty"),
        (json.dumps({"messages": []}).encode(), "messages"),
        (json.dumps({"messages": "hi"}).encode(), "messages"),
        (json.dumps(chat(max_tokens=-5)).encode(), "max_tokens"),
        (json.dumps(chat(temperature="hot")).encode(), "temperature"),
        (json.dumps(chat(max_token=5)).encode(), "unknown field"),
        (json.dumps(chat(n_probs=10**9)).encode(), "n_probs"),
        (json.dumps(chat(n=9)).encode(), "n"),  # more choices than slots
        (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), "role"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "NaN"),
    ],
)
def test_server_bad_chat_requests_are_400(client, body, needle):
    r = client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    err = assert_error(r, 400, "invalid_request_error")
    assert needle.lower() in err["message"].lower()


def test_server_huge_body_is_rejected(client):
    r = client.post("/v1/chat/completions", content=b"x" * (10 * 1024 * 1024))
    assert_error(r, 400)
    assert "too large" in r.json()["error"]["message"]


def test_server_prompt_too_long(client):
    r = client.post("/completion", json={"prompt": "a" * 400, "n_predict": 2})
    err = assert_error(r, 400, "exceed_context_size_error")
    assert err["n_ctx"] == 256 and err["n_prompt_tokens"] == 401


def test_server_unknown_route_and_bad_tokens(client):
    assert_error(client.get("/nope"), 404, "not_found_error")
    assert_error(client.post("/detokenize", json={"tokens": [10**9]}), 400)
    assert_error(client.post("/completion", json={"prompt": [1, -4]}), 400)


def test_server_form_content_type_accepted(client):
    # curl -d sends application/x-www-form-urlencoded; llama-server still reads the JSON
    r = client.post(
        "/completion",
        content=json.dumps({"prompt": "abc", "n_predict": 1}),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200 and r.json()["content"] == "d"


def test_server_embeddings_disabled_is_501():
    sched = make_fake_scheduler()
    handle = start_server(sched, port=0, chat_template=FakeChatTemplate())
    try:
        r = httpx.post(handle.url + "/v1/embeddings", json={"input": "x"})
        assert_error(r, 501, "not_supported_error")
        assert_error(httpx.get(handle.url + "/metrics"), 501)
    finally:
        handle.stop()
        sched.stop()


# -- auth, CORS, logging, port ------------------------------------------------------------


def test_server_api_key_and_request_log():
    sched = make_fake_scheduler()
    seen = []
    handle = start_server(
        sched,
        port=0,
        api_keys=["k1", "k2"],
        cors=["http://example.com"],
        chat_template=FakeChatTemplate(),
        request_log=seen.append,
    )
    try:
        url = handle.url
        assert httpx.get(url + "/health").status_code == 200
        err = assert_error(httpx.get(url + "/v1/models"), 401, "authentication_error")
        assert "api key" in err["message"].lower()
        assert (
            httpx.get(url + "/v1/models", headers={"Authorization": "Bearer nope"}).status_code
            == 401
        )
        assert (
            httpx.get(url + "/v1/models", headers={"Authorization": "Bearer k2"}).status_code == 200
        )
        assert httpx.get(url + "/v1/models", headers={"X-Api-Key": "k1"}).status_code == 200
        pre = httpx.options(
            url + "/v1/chat/completions",
            headers={"Origin": "http://example.com", "Access-Control-Request-Method": "POST"},
        )
        assert pre.headers.get("access-control-allow-origin") == "http://example.com"
        assert any(e["path"] == "/v1/models" and e["status"] == 401 for e in seen)
    finally:
        handle.stop()
        sched.stop()


def test_server_port_in_use_suggests_free_port(server):
    sched = make_fake_scheduler(start=False)
    with pytest.raises(PortInUseError, match=r"already in use; try --port \d+"):
        start_server(sched, port=server.port)


# -- concurrency and cancel -------------------------------------------------------------------


def test_server_16_concurrent_clients(server):
    results, errors = {}, []

    def worker(i):
        try:
            with httpx.Client(base_url=server.url, timeout=30) as c:
                body = {"prompt": "m", "n_predict": 8, "stream": i % 2 == 0}
                r = c.post("/completion", json=body)
                assert r.status_code == 200
                if body["stream"]:
                    results[i] = "".join(e["content"] for e in sse_events(r.text))
                else:
                    results[i] = r.json()["content"]
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert not errors
    assert results == {i: "nopqrstu" for i in range(16)}


def test_server_client_disconnect_frees_slot():
    sched = make_fake_scheduler(n_slots=1, n_ctx=8192, delay_s=0.002)  # ~16 s if not cancelled
    handle = start_server(sched, port=0, chat_template=FakeChatTemplate())
    try:
        with httpx.Client(base_url=handle.url, timeout=10) as c:
            with c.stream(
                "POST", "/completion", json={"prompt": "abc", "n_predict": -1, "stream": True}
            ) as r:
                lines = r.iter_lines()  # keep a reference: closing it closes the connection
                for line in lines:
                    if line.startswith("data: "):
                        break
                assert sched.n_busy() == 1
        deadline = time.monotonic() + 3
        while sched.n_busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sched.n_busy() == 0, sched.slots_info()
        assert sched.metrics.n_tokens_predicted_total < 2000
    finally:
        handle.stop()
        sched.stop()


def test_server_non_streaming_client_gone_frees_slot():
    sched = make_fake_scheduler(n_slots=1, n_ctx=8192, delay_s=0.002)
    handle = start_server(sched, port=0, chat_template=FakeChatTemplate())
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                handle.url + "/completion", json={"prompt": "abc", "n_predict": -1}, timeout=0.3
            )
        deadline = time.monotonic() + 3
        while sched.n_busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sched.n_busy() == 0
        assert sched.metrics.n_tokens_predicted_total < 2000
    finally:
        handle.stop()
        sched.stop()
