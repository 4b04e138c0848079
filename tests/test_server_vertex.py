"""Vertex AI prediction mode (AIP_MODE=PREDICTION): /predict dispatching instances by
@requestFormat, the AIP_* routes and port, per-instance errors and the request's 400s."""

from __future__ import annotations

import httpx
import pytest

from engine.errors import EngineError
from engine.server import ServerOptions, start_server, vertex
from engine.server.testing import FakeChatTemplate, make_fake_scheduler

CHAT = {
    "@requestFormat": "chatCompletions",
    "max_tokens": 3,
    "messages": [{"role": "user", "content": "hi"}],
}


@pytest.fixture
def serve(monkeypatch):
    """start(env, **options) -> base URL of a fake-model server built under those AIP_* variables."""
    started = []

    def start(env: dict[str, str], **options):
        for k in ("AIP_MODE", "AIP_PREDICT_ROUTE", "AIP_HEALTH_ROUTE", "AIP_HTTP_PORT"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        sched = make_fake_scheduler(n_slots=2, n_ctx=512)
        handle = start_server(
            sched, port=0, chat_template=FakeChatTemplate(), options=ServerOptions(**options)
        )
        started.append((handle, sched))
        return handle.url

    yield start
    for handle, sched in started:
        handle.stop()
        sched.stop()


def predict(url: str, body, path: str = "/predict", **kw) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30, **kw)


def test_predict_runs_each_instance_through_its_endpoint(serve):
    url = serve({"AIP_MODE": "PREDICTION"})
    r = predict(
        url,
        {
            "instances": [
                CHAT,
                {
                    **CHAT,
                    "messages": [{"role": "user", "content": "again"}],
                    "stream": True,
                },  # streaming is off
                {"@requestFormat": "/tokenize", "content": "ab"},  # a path works too
                {"@requestFormat": "completion", "prompt": "a", "n_predict": 2},
                {"@requestFormat": "health"},
            ]
        },
    )
    assert r.status_code == 200
    chat, chat2, tokens, native, health = r.json()["predictions"]
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["content"] == "abc"
    assert chat2["choices"][0]["message"]["role"] == "assistant"
    assert tokens == {"tokens": [100, 101]}
    assert native["content"] == "bc" and native["stop"] is True
    assert health == {"status": "ok"}


def test_an_instance_error_takes_its_place(serve):
    url = serve({"AIP_MODE": "PREDICTION"})
    r = predict(
        url,
        {
            "instances": [
                5,
                {"max_tokens": 1},
                {"@requestFormat": "nope"},
                {"@requestFormat": "chatCompletions", "messages": []},
                CHAT,
            ]
        },
    )
    assert r.status_code == 200
    errors = [p["error"] for p in r.json()["predictions"][:4]]
    assert [e["code"] for e in errors] == [400, 400, 400, 400]
    assert "must be a JSON object" in errors[0]["message"]
    assert "@requestFormat" in errors[1]["message"]
    assert "no handler registered for @requestFormat: nope" == errors[2]["message"]
    assert "messages" in errors[3]["message"]
    assert "choices" in r.json()["predictions"][4]


@pytest.mark.parametrize(
    "body, words",
    [
        ([1], "must be a JSON object"),
        ({"instances": {}}, "array field named instances"),
        ({}, "array field named instances"),
        ({"instances": [{}] * 129}, "maximum size of 128"),
    ],
)
def test_bad_predict_bodies_are_400s(serve, body, words):
    url = serve({"AIP_MODE": "PREDICTION"})
    r = predict(url, body)
    assert r.status_code == 400 and words in r.json()["error"]["message"]
    bad = httpx.post(url + "/predict", content=b"{oops", timeout=30)
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]


def test_aip_routes_and_no_routes_outside_prediction_mode(serve):
    url = serve(
        {
            "AIP_MODE": "PREDICTION",
            "AIP_PREDICT_ROUTE": "v1/endpoints/x:predict",
            "AIP_HEALTH_ROUTE": "/isalive",
        }
    )
    assert predict(url, {"instances": [CHAT]}, "/v1/endpoints/x:predict").status_code == 200
    assert predict(url, {"instances": [CHAT]}).status_code == 404  # only the route AIP names
    assert httpx.get(url + "/isalive", timeout=30).json() == {"status": "ok"}
    plain = serve({})
    assert predict(plain, {"instances": [CHAT]}).status_code == 404


def test_instances_pass_the_same_api_key_check(serve):
    url = serve({"AIP_MODE": "PREDICTION"}, api_keys=("k1",))
    assert predict(url, {"instances": [CHAT]}).status_code == 401
    r = predict(url, {"instances": [CHAT]}, headers={"Authorization": "Bearer k1"})
    assert r.status_code == 200 and "choices" in r.json()["predictions"][0]


def test_gcp_format_aliases():
    assert vertex.gcp_format("/v1/chat/completions") == "chatCompletions"
    assert vertex.gcp_format("/apply-template") == "applyTemplate"
    assert vertex.gcp_format("/slots/{id_slot}") == "slots"
    assert vertex.gcp_format("/completion") == "completion"
    assert vertex.gcp_format("/v1/responses/input_tokens") == "responsesInputTokens"


def test_settings_and_port_from_the_environment():
    assert vertex.settings({}) is None
    assert vertex.listen_port(9000, {}) == 9000
    assert vertex.listen_port(9000, {"AIP_MODE": "PREDICTION"}) == 8080  # llama-server's default
    s = vertex.settings(
        {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "7001", "AIP_HEALTH_ROUTE": "h"}
    )
    assert s == vertex.VertexSettings(predict_route="/predict", health_route="/h", port=7001)
    with pytest.raises(EngineError, match="AIP_HTTP_PORT"):
        vertex.settings({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "eighty"})


def test_router_mode_serves_predict_too(monkeypatch):
    from types import SimpleNamespace

    from fastapi.testclient import TestClient

    from engine.router.proxy import create_router_app
    from engine.server.state import ServerState

    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    app = create_router_app(SimpleNamespace(), ServerState(ServerOptions()))
    with TestClient(app) as c:
        r = c.post(
            "/predict",
            json={"instances": [{"@requestFormat": "health"}, {"@requestFormat": "nope"}]},
        )
    assert r.status_code == 200
    ok, missing = r.json()["predictions"]
    assert ok == {"status": "ok"} and missing["error"]["code"] == 400


def test_aip_health_route_needs_no_api_key(serve):
    # Vertex AI probes the health route without credentials, as a load balancer probes /health
    url = serve({"AIP_MODE": "PREDICTION", "AIP_HEALTH_ROUTE": "/isalive"}, api_keys=("k1",))
    r = httpx.get(url + "/isalive", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert (
        predict(url, {"instances": [CHAT]}).status_code == 401
    )  # the predict route still needs it
    prefixed = serve(
        {"AIP_MODE": "PREDICTION", "AIP_HEALTH_ROUTE": "isalive"},
        api_keys=("k1",),
        api_prefix="/api",
    )
    assert httpx.get(prefixed + "/api/isalive", timeout=30).status_code == 200
    assert httpx.get(prefixed + "/isalive", timeout=30).status_code == 404
