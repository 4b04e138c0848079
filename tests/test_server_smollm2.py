"""`ggstation serve` with the SmolLM2 starter model (marked `model`): the openai SDK with the
model's chat template, raw HTTP errors, 16 concurrent clients on 4 slots, the same seeded
text as `ggstation generate`."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from test_server_process import ROOT, ServeProcess, run_clients

pytestmark = pytest.mark.model

# Seconds from spawning `ggstation serve` to its first /health answer (503 while the model
# loads): Python, numpy, numba and the HTTP stack import first. Measured 1.0-2.1 s on the
# 2-core development machine with other test runs beside it (load average 2-3); loose
# because imports slow down with the machine. Marked perf, deselected by default.
FIRST_ANSWER_LIMIT_S = 5.0


@pytest.fixture(scope="module")
def server(smollm2_path):
    p = ServeProcess(
        smollm2_path, "-np", "4", "-c", "4096", "--metrics", "-ngl", "99", "--alias", "smol"
    )
    try:
        p.wait_ready()
        yield p
    finally:
        p.stop()


def test_serve_health_503_then_200(server):
    status, _ = server.first_status
    assert status in (503, 200)  # 503 "Loading model" if it answered while the model loaded
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


@pytest.mark.perf
def test_serve_first_health_answer_is_fast(server, perf_figure):
    _, t = server.first_status
    perf_figure(
        "serve SmolLM2: spawn to first /health answer", t, "s", at_most=FIRST_ANSWER_LIMIT_S
    )


def test_serve_openai_sdk(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    r = client.completions.create(
        model="smol", prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert r.choices[0].text.strip() and r.usage.completion_tokens <= 8
    assert [m.id for m in client.models.list()] == ["smol"]
    chat = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Say hi"}], max_tokens=8, temperature=0
    )
    assert chat.choices[0].message.content and chat.choices[0].finish_reason in ("stop", "length")
    stream = client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == chat.choices[0].message.content


def test_serve_raw_http_errors(server):
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{oops")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/completion", json={"prompt": "hi " * 1200, "n_predict": 1})
    assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error"
    assert httpx.get(server.url + "/nope").status_code == 404
    assert httpx.post(server.url + "/v1/embeddings", json={"input": "x"}).status_code == 501


@pytest.mark.slow  # a minute of 16 streams on 2 cores
def test_serve_16_concurrent_clients(server):
    run_clients(
        server.url,
        lambda i: {
            "prompt": f"Count: {i},",
            "n_predict": 4,
            "temperature": 0,
            "stream": i % 2 == 0,
        },
        timeout=180,
    )
    metrics = httpx.get(server.url + "/metrics").text
    busy = float(
        next(
            ln.split()[-1]
            for ln in metrics.splitlines()
            if ln.startswith("llamacpp:n_busy_slots_per_decode")
        )
    )
    assert busy > 1.0  # decodes were shared by several slots


def test_serve_same_text_as_generate(server, smollm2_path):
    prompt, n = "Once upon a time", 12
    body = {"prompt": prompt, "n_predict": n, "temperature": 0.7, "seed": 42, "cache_prompt": False}
    served = httpx.post(server.url + "/completion", json=body, timeout=120).json()["content"]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine",
            "generate",
            "-m",
            str(smollm2_path),
            "-p",
            prompt,
            "-n",
            str(n),
            "--temp",
            "0.7",
            "-s",
            "42",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip("\n") == served
