"""`ggstation generate`, `ggstation chat` and `ggstation serve` share one decode driver (the
scheduler): with the same flags and seed they give the same text, context shift included."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from test_server_process import ROOT, ServeProcess

PROMPT = "the weather in the hills"
USER = "tell me about the hills"

CASES = {
    # name: flags shared by the three commands
    "sampled": ["-c", "256", "--seed", "7", "--temp", "0.9", "-n", "24"],
    "context-shift": [
        "-c",
        "48",
        "--seed",
        "11",
        "--temp",
        "0.8",
        "-n",
        "90",
        "--context-shift",
        "--keep",
        "3",
        "--ignore-eos",
    ],
}


def _cli(*args: str, stdin: str | None = None) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "engine", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tiny_llama_path):
    flags = CASES[request.param]
    server = ServeProcess(tiny_llama_path, "-np", "1", *flags)
    try:
        server.wait_ready()
        yield tiny_llama_path, flags, server
    finally:
        server.stop()


def test_generate_and_serve_completion_agree(case):
    model, flags, server = case
    served = httpx.post(server.url + "/completion", json={"prompt": PROMPT}, timeout=120).json()
    text = _cli("generate", "-m", str(model), "-p", PROMPT, *flags)
    assert served["content"] and text == served["content"]
    shifted = "--context-shift" in flags  # the reply ran past the 48-token context
    assert served["truncated"] is shifted
    if shifted:
        assert served["tokens_predicted"] == 90


def test_chat_and_serve_chat_completions_agree(case):
    model, flags, server = case
    body = {"messages": [{"role": "user", "content": USER}]}
    served = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
    reply = served["choices"][0]["message"]["content"]
    text = _cli("chat", "-m", str(model), *flags, stdin=USER)
    assert reply and text == reply + "\n"
