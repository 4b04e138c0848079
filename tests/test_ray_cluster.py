"""`ggstation serve --ray` on a real two-node Ray cluster (marker `cluster`; the extra
`ggstation[cluster]`).

One cluster per module: `ray.cluster_utils.Cluster`, Ray's own multi-node harness, starts a
head node and a worker node on this machine (2 CPUs each) as processes it tracks, so teardown
ends exactly those (a machine-wide `ray stop` would also end clusters that are not ours). The
server under test is the real CLI, `python -m engine serve --ray ADDRESS`, in a subprocess, and
the test process joins the cluster as a second driver only to kill a replica.

Models: tiny generated GGUFs. `alpha` and `beta` are wide enough (4 layers, n_embd 256) that a
long generation streams for seconds, so a replica can die mid-stream and a load can last while
Serve scales `beta` from 1 to 2 replicas.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.cluster

from ggufgen import write_tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BAD_SHA = "0" * 64
NODE_MEMORY = (
    256 << 20
)  # each node's Ray `memory` resource: room for the tiny models, not for "huge"
WIDE = dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_ctx_train=4096)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _preset(d: Path) -> Path:
    models = {
        "alpha": write_tiny_model(d / "alpha.gguf", seed=1, **WIDE),
        "beta": write_tiny_model(d / "beta.gguf", seed=2, **WIDE),
        "gamma": write_tiny_model(d / "gamma.gguf", seed=3),
    }
    text = ["[*]", "ctx-size = 2048", "parallel = 2", "threads = 1", ""]
    for name in ("alpha", "gamma"):
        text += [f"[{name}]", f"model = {models[name]}", ""]
    text += [
        "[beta]",
        f"model = {models['beta']}",
        "min-replicas = 1",
        "max-replicas = 2",
        "target-ongoing-requests = 1",
        "upscale-delay-s = 0.5",
        "",
        "[bad]",
        f"model = {models['alpha']}",
        f"sha256 = {BAD_SHA}",
        "",
        # ~550 MB by the engine's estimate (the KV cache and buffers of 262144 positions):
        # more than the NODE_MEMORY either node declares
        "[huge]",
        f"model = {models['alpha']}",
        "ctx-size = 262144",
        "parallel = 1",
        "",
    ]
    path = d / "preset.ini"
    path.write_text("\n".join(text))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"num_cpus": 2, "memory": NODE_MEMORY, "include_dashboard": False},
    )
    try:
        c.add_node(num_cpus=2, memory=NODE_MEMORY)
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()


@pytest.fixture(scope="module")
def server(cluster, tmp_path_factory):
    d = tmp_path_factory.mktemp("ray-models")
    preset = _preset(d)
    port = _free_port()
    env = dict(
        os.environ,
        GGSTATION_MODELS_DIR=str(d / "store"),
        HF_HOME=str(d / "hf"),
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "engine",
            "serve",
            "--ray",
            cluster.address,
            "--port",
            str(port),
            "--models-preset",
            str(preset),
            "--models-max",
            "2",
            "--no-models-autoload",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(proc.stdout or []), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, "".join(log)
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the ingress did not come up:\n" + "".join(log))
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def driver(cluster):
    import ray

    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    yield ray
    ray.shutdown()


def _status(url: str, name: str) -> dict:
    models = httpx.get(url + "/models", timeout=10).json()["data"]
    return next(m["status"] for m in models if m["id"] == name)


def _load(url: str, name: str, timeout: float = 120) -> dict:
    r = httpx.post(url + "/models/load", json={"model": name}, timeout=timeout)
    assert r.status_code == 200, r.text
    return _wait_status(url, name, ("loaded",), timeout)


def _wait_status(url: str, name: str, wanted: tuple[str, ...], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = _status(url, name)
        if status["value"] in wanted or (status.get("failed") and "unloaded" in wanted):
            return status
        assert status["value"] != "unloaded" or "unloaded" in wanted, status
        assert time.monotonic() < deadline, f"{name} still {status}"
        time.sleep(0.5)


def _deployments(url: str) -> dict:
    return httpx.get(url + "/health", timeout=10).json()["cluster"]["deployments"]


def _client(url: str):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def _long_stream(url: str, model: str, n: int = 1500):
    return _client(url).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "count"}],
        max_tokens=n,
        stream=True,
        extra_body={"ignore_eos": True},
    )


def test_two_models_stream_through_the_ingress(server):
    for name in ("alpha", "beta"):
        _load(server, name)
    for name in ("alpha", "beta"):
        chunks = [
            c
            for c in _client(server).chat.completions.create(
                model=name,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=12,
                stream=True,
                extra_body={"ignore_eos": True},
            )
        ]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        # a token that ends inside a UTF-8 character sends no chunk of its own: fewer than 12
        assert len(chunks) > 3 and text and chunks[-1].choices[0].finish_reason == "length", chunks
        assert {c.model for c in chunks} == {name}
    t0 = time.monotonic()
    stream = iter(_long_stream(server, "alpha", 600))
    next(stream)
    t_first = time.monotonic() - t0
    n = 1 + sum(1 for _ in stream)
    # passed through as generated, not collected by the ingress and sent at the end
    total = time.monotonic() - t0
    assert n > 500 and t_first < 0.5 * total, (n, t_first, total)
    health = httpx.get(server + "/health", timeout=10).json()
    assert len([n for n in health["cluster"]["nodes"] if n["alive"]]) == 2
    deps = health["cluster"]["deployments"]
    assert (
        deps["alpha"]["replicas"].get("RUNNING") == 1
        and deps["beta"]["replicas"].get("RUNNING") == 1
    )


def test_replicas_declare_threads_and_the_engines_memory_estimate(server):
    from engine.model_info import inspect_model

    alpha = _deployments(server)["alpha"]
    path = next(
        m["path"]
        for m in httpx.get(server + "/models", timeout=10).json()["data"]
        if m["id"] == "alpha"
    )
    expected = inspect_model(path).estimate(n_ctx=2048, n_seq_max=2).total_bytes
    assert (alpha["num_cpus"], alpha["n_slots"], alpha["memory_bytes"]) == (1, 2, expected)


def test_a_model_no_node_can_hold_is_refused(server):
    r = httpx.post(server + "/models/load", json={"model": "huge"}, timeout=60)
    assert r.status_code == 200, r.text
    status = _wait_status(server, "huge", ("unloaded",), 30)
    assert status.get("failed") and "more than any node of the cluster offers" in status["error"], (
        status
    )
    assert "huge" not in _deployments(server)


def test_replica_killed_mid_stream_errors_and_recovers(server, driver):
    import openai

    stream = _long_stream(server, "alpha")
    it = iter(stream)
    for _ in range(5):
        next(it)
    (replica,) = [
        a["name"]
        for a in driver.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::ggstation-model-alpha#")
    ]
    t0 = time.monotonic()
    driver.kill(driver.get_actor(replica, namespace="serve"), no_restart=True)
    with pytest.raises(openai.APIError, match="stopped before finishing"):
        for _ in it:
            pass
    assert time.monotonic() - t0 < 30  # an error event, not a hang
    deadline = time.monotonic() + 90
    while True:  # Serve starts a new replica; the model answers again
        try:
            r = httpx.post(
                server + "/v1/completions",
                json={"model": "alpha", "prompt": "a", "max_tokens": 2},
                timeout=30,
            )
            if r.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "alpha did not recover"
        time.sleep(1)
    names = [
        a["name"]
        for a in driver.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::ggstation-model-alpha#")
    ]
    assert names and replica not in names


def test_beta_scales_from_one_to_two_replicas_under_load(server):
    assert _deployments(server)["beta"]["replicas"].get("RUNNING") == 1
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                for _ in _long_stream(server, "beta", 400):
                    if stop.is_set():
                        break
            except Exception:  # the load only has to be there
                time.sleep(0.2)

    workers = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + 90
        while _deployments(server)["beta"]["replicas"].get("RUNNING", 0) < 2:
            assert time.monotonic() < deadline, _deployments(server)["beta"]
            time.sleep(1)
    finally:
        stop.set()
        for w in workers:
            w.join(30)


def test_unload_deletes_the_deployment(server):
    r = httpx.post(server + "/models/unload", json={"model": "beta"}, timeout=30)
    assert r.status_code == 200, r.text
    _wait_status(server, "beta", ("unloaded",), 60)
    deadline = time.monotonic() + 30
    while "beta" in _deployments(server):
        assert time.monotonic() < deadline
        time.sleep(0.5)


def test_models_max_is_cluster_wide(server):
    assert _status(server, "alpha")["value"] == "loaded"
    _load(server, "gamma")
    _load(server, "beta")  # a third model: the least recently used idle one makes room
    loaded = [
        m["id"]
        for m in httpx.get(server + "/models", timeout=10).json()["data"]
        if m["status"]["value"] in ("loaded", "loading")
    ]
    assert "beta" in loaded and len(loaded) == 2, loaded
    deadline = time.monotonic() + 30
    while len(_deployments(server)) > 2:
        assert time.monotonic() < deadline, _deployments(server)
        time.sleep(0.5)


def test_sha256_mismatch_fails_the_deployment(server):
    r = httpx.post(server + "/models/load", json={"model": "bad"}, timeout=60)
    assert r.status_code == 200, r.text
    status = _wait_status(server, "bad", ("unloaded",), 90)
    assert status.get("failed") is True and "sha256" in status.get("error", ""), status
    assert BAD_SHA in status["error"]
    deadline = time.monotonic() + 30
    while "bad" in _deployments(server):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    r = httpx.post(server + "/v1/completions", json={"model": "bad", "prompt": "a"}, timeout=30)
    assert r.status_code == 400 and "not loaded" in r.text


def test_a_restarted_ingress_adopts_the_running_models(server, driver):
    def loaded() -> set[str]:
        return {
            m["id"]
            for m in httpx.get(server + "/models", timeout=10).json()["data"]
            if m["status"]["value"] == "loaded"
        }

    before = loaded()
    assert before
    (ingress,) = [
        a["name"]
        for a in driver.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::ggstation#Ingress#")
    ]
    driver.kill(driver.get_actor(ingress, namespace="serve"), no_restart=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(server + "/health", timeout=5).status_code == 200 and loaded() == before:
                break
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        assert time.monotonic() < deadline, "the ingress did not come back with its models"
        time.sleep(0.5)
    model = sorted(before)[0]
    r = httpx.post(
        server + "/v1/completions",
        json={"model": model, "prompt": "a", "max_tokens": 2},
        timeout=30,
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "address, message",
    [
        ("127.0.0.1:1", "nothing answers"),
        ("no-port-here", "expected host:port"),
        ("LISTENER", "within 8 s"),
    ],
)
def test_bad_address_is_a_clear_error(address, message):
    import socket

    with socket.socket() as listener:  # answers TCP, but is no Ray: the connection deadline ends it
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = address.replace("LISTENER", f"127.0.0.1:{listener.getsockname()[1]}")
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "engine", "serve", "--ray", address, "--port", "0"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, GGSTATION_RAY_CONNECT_TIMEOUT="8"),
        )
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert time.monotonic() - t0 < 30
    assert "Traceback" not in r.stderr


def test_api_answers_json_errors_through_ray(server):
    r = httpx.post(
        server + "/v1/chat/completions", json={"model": "nope", "messages": []}, timeout=30
    )
    assert r.status_code in (400, 404) and "error" in json.loads(r.text)
