"""engine/remote.py against real local servers: a plain OpenAI-shaped server (tests/openai_server.py:
no /props, /slots or /metrics; API key checked; faults on demand) and a real `ggstation serve`
process with a tiny generated model (llama-server's /props, /slots and /metrics)."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

import openai_server
from engine import (
    RemoteClient,
    RemoteEndpoint,
    RemoteError,
    RemoteSampling,
    ServerInfo,
    normalize_url,
    stream_chat,
)
from engine.remote import (
    KIND_GGSTATION,
    KIND_LLAMA,
    KIND_OPENAI,
    ChatStream,
    chat_body,
    parse_metrics,
)

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def oai():
    server = openai_server.start(api_key="good-key", models=("alpha", "beta"))
    yield server
    server.stop()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


# -- URLs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "typed, url",
    [
        ("http://host:8080", "http://host:8080"),
        ("  localhost:8080/  ", "http://localhost:8080"),
        ("https://api.example.com/v1/", "https://api.example.com"),
        ("http://10.0.0.2:8000/serve/v1", "http://10.0.0.2:8000/serve"),
    ],
)
def test_normalize_url_accepts_what_people_type(typed, url):
    assert normalize_url(typed) == url


@pytest.mark.parametrize(
    "typed", ["", "ftp://host", "http://", "http://host:99999", "not a url", "http://a b"]
)
def test_normalize_url_rejects_non_http(typed):
    with pytest.raises(RemoteError) as e:
        normalize_url(typed)
    assert e.value.reason == RemoteError.BAD_URL


# -- a plain OpenAI server --------------------------------------------------------------------------


def test_remote_lists_models_with_the_key(oai):
    with RemoteClient(RemoteEndpoint(oai.url, "good-key")) as c:
        assert [m.id for m in c.list_models()] == ["alpha", "beta"]


@pytest.mark.parametrize(
    "key, words", [("bad-key", "refused the API key"), ("", "needs an API key")]
)
def test_remote_wrong_or_missing_key_is_an_auth_error(oai, key, words):
    with RemoteClient(RemoteEndpoint(oai.url, key)) as c, pytest.raises(RemoteError) as e:
        c.list_models()
    assert e.value.reason == RemoteError.AUTH and e.value.status == 401
    assert words in str(e.value) and "Incorrect API key" in str(e.value)
    with pytest.raises(RemoteError) as e:
        list(stream_chat(RemoteEndpoint(oai.url, key), "alpha", MESSAGES, RemoteSampling()))
    assert e.value.reason == RemoteError.AUTH


def test_remote_probe_of_plain_openai_server_has_no_llama_extras(oai):
    with RemoteClient(RemoteEndpoint(oai.url, "good-key")) as c:
        info = c.probe()
    assert info == ServerInfo(kind=KIND_OPENAI) and not info.llama_like and not info.has_slots


def test_remote_stream_chat_yields_the_reply_and_usage(oai):
    ep = RemoteEndpoint(oai.url, "good-key")
    sampling = RemoteSampling(
        temperature=0.3, top_p=0.8, max_tokens=64, seed=5, stop=("##",), top_k=7, min_p=0.1
    )
    deltas = list(stream_chat(ep, "beta", MESSAGES, sampling, ServerInfo()))
    assert "".join(d.text for d in deltas) == openai_server.REPLY
    last = deltas[-1]
    assert last.finish_reason == "stop" and all(d.finish_reason is None for d in deltas[:-1])
    n_words = len(openai_server.REPLY.split(" "))
    assert last.n_prompt == 7 and last.n_generated == n_words
    assert [d.n_generated for d in deltas[:-1]] == list(range(1, n_words + 1))
    body = oai.requests[-1]
    assert body["model"] == "beta" and body["stream"] is True and body["messages"] == MESSAGES
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"], body["stop"]) == (
        0.3,
        0.8,
        64,
        5,
        ["##"],
    )
    assert "top_k" not in body and "min_p" not in body  # a plain OpenAI server may reject them


def test_remote_probe_reads_llama_server_props_and_a_router(oai):
    oai.props = {
        "default_generation_settings": {"n_ctx": 4096, "params": {}},
        "total_slots": 4,
        "endpoint_slots": True,
        "endpoint_metrics": False,
        "build_info": "b6000-abc",
    }
    with RemoteClient(RemoteEndpoint(oai.url, "good-key")) as c:
        info = c.probe()
        assert (info.kind, info.n_ctx, info.total_slots, info.has_slots, info.has_metrics) == (
            KIND_LLAMA,
            4096,
            4,
            True,
            False,
        )
        # llama-server's router: llama-server's fields, but /slots and /metrics are per model
        oai.props = {
            "role": "router",
            "default_generation_settings": {"n_ctx": 0},
            "build_info": "b6000",
        }
        info = c.probe()
        assert info.llama_like and not info.has_slots and not info.has_metrics


def test_remote_chat_body_sends_llama_extras_only_to_llama_servers():
    s = RemoteSampling(top_k=40, min_p=0.05, repeat_penalty=1.1)
    llama = chat_body("m", MESSAGES, s, ServerInfo(kind=KIND_GGSTATION))
    assert (llama["top_k"], llama["min_p"], llama["repeat_penalty"]) == (40, 0.05, 1.1)
    assert "seed" not in llama and "stop" not in llama  # not set: the server's defaults
    assert "top_k" not in chat_body("m", MESSAGES, s, None)


def test_remote_connection_dropped_mid_stream_is_a_broken_error(oai):
    oai.drop_after = 3
    got: list[str] = []
    with pytest.raises(RemoteError) as e:
        for d in stream_chat(
            RemoteEndpoint(oai.url, "good-key"), "alpha", MESSAGES, RemoteSampling()
        ):
            got.append(d.text)
    assert e.value.reason == RemoteError.BROKEN and "ended in the middle of the reply" in str(
        e.value
    )
    assert len(got) == 3  # what came before the break was delivered


def test_remote_not_json_answers_are_named(oai):
    oai.not_json = True
    with RemoteClient(RemoteEndpoint(oai.url, "good-key")) as c, pytest.raises(RemoteError) as e:
        c.list_models()
    assert e.value.reason == RemoteError.NOT_OPENAI and "not JSON" in str(e.value)
    with pytest.raises(RemoteError) as e:
        list(stream_chat(RemoteEndpoint(oai.url, "good-key"), "alpha", MESSAGES, RemoteSampling()))
    assert e.value.reason == RemoteError.NOT_OPENAI


def test_remote_unknown_model_is_not_found(oai):
    with pytest.raises(RemoteError) as e:
        list(stream_chat(RemoteEndpoint(oai.url, "good-key"), "gone", MESSAGES, RemoteSampling()))
    assert e.value.reason == RemoteError.NOT_FOUND and "does not exist" in str(e.value)


def test_remote_unreachable_host_is_a_clear_error():
    url = f"http://127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    with RemoteClient(RemoteEndpoint(url)) as c, pytest.raises(RemoteError) as e:
        c.list_models()
    assert e.value.reason == RemoteError.UNREACHABLE and url in str(e.value)
    assert time.monotonic() - t0 < 5


def test_remote_silent_server_times_out_instead_of_hanging():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)  # accepts connections (the kernel does) and never answers
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.monotonic()
        with RemoteClient(RemoteEndpoint(url), timeout_s=0.5) as c, pytest.raises(RemoteError) as e:
            c.list_models()
        assert e.value.reason == RemoteError.TIMEOUT and time.monotonic() - t0 < 3
        stream = ChatStream(
            RemoteEndpoint(url),
            chat_body("m", MESSAGES, RemoteSampling(), None),
            read_timeout_s=0.5,
        )
        with pytest.raises(RemoteError) as e:
            list(stream)
        assert e.value.reason == RemoteError.TIMEOUT
    finally:
        listener.close()


def test_remote_cancel_from_another_thread_ends_the_stream_and_the_server_sees_it(oai):
    oai.endless = True
    stream = stream_chat(RemoteEndpoint(oai.url, "good-key"), "alpha", MESSAGES, RemoteSampling())
    n = 0
    for _ in stream:
        n += 1
        if n == 5:
            threading.Timer(0.05, stream.cancel).start()
        assert n < 2000, "cancel() did not end the stream"
    assert stream.cancelled
    assert oai.cancelled.wait(10), "the server did not see the client leave"


@pytest.mark.parametrize("send_headers", [True, False])
def test_remote_cancel_wakes_a_read_blocked_on_a_silent_server(send_headers):
    """Stop must work while the server sends nothing yet (reading a long prompt), before or
    after its headers: cancel() shuts the socket down, which wakes the blocked read long
    before its 300 s timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    conns: list[socket.socket] = []

    def answer_headers_then_nothing():
        conn, _ = listener.accept()
        conns.append(conn)
        conn.recv(65536)
        if send_headers:
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )

    threading.Thread(target=answer_headers_then_nothing, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        stream = ChatStream(RemoteEndpoint(url), chat_body("m", MESSAGES, RemoteSampling(), None))
        done = threading.Event()
        threading.Thread(target=lambda: (list(stream), done.set()), daemon=True).start()
        time.sleep(0.5)
        assert not done.is_set()  # blocked in the read
        t0 = time.monotonic()
        stream.cancel()
        assert done.wait(3) and time.monotonic() - t0 < 3
    finally:
        listener.close()
        for c in conns:
            c.close()


def test_parse_metrics_reads_llamacpp_samples():
    m = parse_metrics(
        "# HELP x\nllamacpp:tokens_predicted_total 42\nllamacpp:requests_processing 1\n"
        "llamacpp:predicted_tokens_seconds 12.5\nother_metric 3\nllamacpp:garbage x\n"
    )
    assert (m.tokens_predicted_total, m.requests_processing, m.predicted_tokens_seconds) == (
        42,
        1,
        12.5,
    )


# -- a real ggstation server ----------------------------------------------------------------------------


def test_remote_ggstation_server_lists_probes_streams_and_reports_load(ggstation):
    ep = RemoteEndpoint(ggstation.url, "sekret")
    with RemoteClient(ep) as c:
        models = c.list_models()
        info = c.probe()
        assert [m.id for m in models] == ["tiny"] and models[0].n_ctx == 1024
        assert info.kind == KIND_GGSTATION and info.llama_like
        assert (info.n_ctx, info.total_slots, info.has_slots, info.has_metrics) == (
            1024,
            2,
            True,
            True,
        )
        deltas = list(
            stream_chat(ep, "tiny", MESSAGES, RemoteSampling(max_tokens=8, seed=1, top_k=5), info)
        )
        last = deltas[-1]
        assert last.finish_reason in ("stop", "length") and last.n_prompt > 0
        assert last.n_generated == len(deltas) - 1 <= 8 and last.t_gen_ms >= 0
        slots = c.slots()
        assert [s.id for s in slots] == [0, 1] and all(s.n_ctx == 1024 for s in slots)
        assert c.metrics().tokens_predicted_total >= last.n_generated
    with RemoteClient(RemoteEndpoint(ggstation.url, "wrong")) as c, pytest.raises(RemoteError) as e:
        c.list_models()
    assert e.value.reason == RemoteError.AUTH


def test_remote_ggstation_cancel_stops_generation_on_the_server(ggstation):
    ep = RemoteEndpoint(ggstation.url, "sekret")
    body = chat_body(
        "tiny", MESSAGES, RemoteSampling(max_tokens=100_000), ServerInfo(kind=KIND_GGSTATION)
    )
    stream = ChatStream(ep, {**body, "ignore_eos": True})
    with RemoteClient(ep) as c:
        for n, _ in enumerate(stream):
            if n == 3:
                assert any(s.is_processing for s in c.slots())
                stream.cancel()
        deadline = time.monotonic() + 10
        while any(s.is_processing for s in c.slots()):
            assert time.monotonic() < deadline, "the server kept generating after the client left"
            time.sleep(0.05)
        before = c.metrics().tokens_predicted_total
        time.sleep(0.5)
        assert c.metrics().tokens_predicted_total == before


def test_remote_ggstation_rejects_a_bad_request_with_its_message(ggstation):
    ep = RemoteEndpoint(ggstation.url, "sekret")
    with pytest.raises(RemoteError) as e:
        list(ChatStream(ep, {"model": "tiny", "messages": "nope", "stream": True}))
    assert e.value.reason == RemoteError.SERVER and e.value.status == 400
    assert isinstance(httpx.codes(e.value.status), int)
