"""Router mode with real child servers (tiny generated models): autoload, proxying with
streaming, LRU unload, explicit load/unload, crash detection, API key, `serve` without -m.
Scheduling and presets without processes: test_router_sched.py, test_router_presets.py."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import httpx
import pytest

from engine.router.proxy import create_router_app
from engine.router.supervisor import Router, _engine_command, discover_models
from engine.server import ServerOptions, ServerState, listen


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    from ggufgen import write_tiny_model

    d = tmp_path_factory.mktemp("models")
    write_tiny_model(d / "alpha.gguf", arch="llama")
    write_tiny_model(d / "beta.gguf", arch="llama")
    return d


@pytest.fixture(scope="module")
def routed(models_dir):
    router = Router(discover_models(models_dir), ["-c", "512", "-np", "2"], models_max=1).start()
    state = ServerState(ServerOptions(api_keys=("key",)))
    handle = listen(state, "127.0.0.1", 0, app=create_router_app(router, state))
    client = httpx.Client(base_url=handle.url, headers={"Authorization": "Bearer key"}, timeout=120)
    yield router, client
    client.close()
    router.stop()
    handle.stop()


def status(client, name):
    return next(
        m["status"]["value"] for m in client.get("/v1/models").json()["data"] if m["id"] == name
    )


def test_router_lists_models_unloaded(routed):
    router, client = routed
    data = client.get("/v1/models").json()["data"]
    assert sorted(m["id"] for m in data) == ["alpha", "beta"]
    assert httpx.get(str(client.base_url) + "/v1/models").status_code == 401
    assert httpx.get(str(client.base_url) + "/health").status_code == 200


def test_router_autoloads_and_proxies(routed):
    router, client = routed
    r = client.post(
        "/completion", json={"model": "alpha", "prompt": "the", "n_predict": 4, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    assert r.json()["tokens_predicted"] <= 4
    assert status(client, "alpha") == "loaded"
    r = client.post(
        "/v1/completions", json={"model": "alpha", "prompt": "the", "max_tokens": 4, "stream": True}
    )
    lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]" and json.loads(lines[0])["object"] == "text_completion"
    assert client.get("/props", params={"model": "alpha"}).json()["model_alias"] == "alpha"


def wait_status(client, name, want, timeout=60):
    deadline = time.monotonic() + timeout
    while (got := status(client, name)) != want:
        assert time.monotonic() < deadline, f"{name} is {got}, not {want}"
        time.sleep(0.05)


def test_router_lru_unload_and_explicit_load_unload(routed):
    router, client = routed
    client.post("/completion", json={"model": "alpha", "prompt": "a", "n_predict": 1})
    r = client.post("/completion", json={"model": "beta", "prompt": "a", "n_predict": 1})
    assert r.status_code == 200
    assert status(client, "beta") == "loaded"
    wait_status(client, "alpha", "unloaded")  # models_max 1
    assert client.post("/models/unload", json={"model": "beta"}).json() == {"success": True}
    wait_status(client, "beta", "unloaded")
    r = client.post("/models/unload", json={"model": "beta"})
    assert r.status_code == 400 and "not running" in r.json()["error"]["message"]
    assert client.post("/models/load", json={"model": "alpha"}).json() == {"success": True}
    r = client.post("/models/load", json={"model": "alpha"})
    assert r.status_code == 400 and "already running" in r.json()["error"]["message"]
    router.ensure_ready("alpha", timeout=120)
    assert status(client, "alpha") == "loaded"


def test_router_unknown_model_and_missing_field(routed):
    router, client = routed
    r = client.post(
        "/v1/chat/completions",
        json={"model": "nope", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 400 and "not found" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert (
        r.status_code == 400
        and r.json()["error"]["message"] == "model name is missing from the request"
    )
    assert client.post("/models/load", json={}).status_code == 400
    assert client.post("/models/load", json={"model": "nope"}).status_code == 404


def test_router_notices_crash(routed):
    router, client = routed
    child = router.ensure_ready("alpha", timeout=120)
    os.kill(child.proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not router.get("alpha").failed and time.monotonic() < deadline:
        time.sleep(0.05)
    info = next(m for m in client.get("/v1/models").json()["data"] if m["id"] == "alpha")
    assert info["status"]["value"] == "unloaded" and info["status"]["failed"] is True
    assert info["status"]["exit_code"] == -signal.SIGKILL
    r = client.post(
        "/completion", json={"model": "alpha", "prompt": "a", "n_predict": 1}
    )  # reloads
    assert r.status_code == 200


def test_router_serve_command_without_model(models_dir):
    import subprocess
    import sys

    from test_server_process import ROOT, free_port

    port = free_port()
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "engine",
            "serve",
            "--models-dir",
            str(models_dir),
            "--port",
            str(port),
            "-c",
            "512",
            "-np",
            "1",
        ],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        r = httpx.post(
            url + "/completion",
            json={"model": "beta", "prompt": "the", "n_predict": 2},
            timeout=120,
        )
        assert r.status_code == 200, r.text
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0


def test_children_of_a_bundle_run_the_bundle_itself(monkeypatch):
    assert _engine_command()[1:] == ["-m", "engine"]
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert _engine_command() == [sys.executable]
