"""Compare our harmony reply parser (engine/server/tool_calls.py) with llama-server's gpt-oss
parser (not a test: it needs a local llama.cpp build, and no network).

    python tests/compare_harmony.py [LLAMA_SERVER_BIN]

Starts llama-server on a tiny gpt-oss model with llama.cpp's gpt-oss template
(tests/ggufgen_gptoss.py) and makes it produce known harmony replies: a GBNF grammar forces the
exact text (without tools; llama-server refuses a grammar with tools), and for tool calls its
own tool_choice "required" grammar forces the format (logit biases on <|end|> vary the text).
For each reply it prints whether llama-server's message (content, reasoning_content,
tool_calls) equals ours for the raw text (its __verbose content).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from gguf import GGMLQuantizationType

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from engine.server.tool_calls import parse_message  # noqa: E402
from ggufgen_gptoss import write_tiny_gptoss  # noqa: E402

BIN = "/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server"
PORT = 18089
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string", "maxLength": 8}},
                "required": ["location"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "integer"}},
                "required": ["q"],
            },
        },
    },
]
FORCED = [
    "<|channel|>analysis<|message|>User asks. Answer.<|end|><|start|>assistant<|channel|>final<|message|>Sunny.",
    "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
    "<|channel|>final<|message|>Hi there.",
    "<|channel|>analysis<|message|>A.<|end|><|start|>assistant<|channel|>analysis<|message|>B.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>C.",
    "<|channel|>analysis<|message|>Need tool.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"location": "Paris"}',
    "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=browser.search "
    "<|constrain|>json<|message|>{}<|end|>",
]


def grammar(text: str) -> str:
    """GBNF for exactly `text`, harmony's markup as tokens."""
    parts = re.split(r"(<\|[a-z]+\|>)", text)
    return "root ::= " + " ".join(p if p.startswith("<|") else json.dumps(p) for p in parts if p)


def compare(url: str, body: dict, tools: bool) -> str:
    r = httpx.post(url + "/v1/chat/completions", json={**body, "verbose": True}, timeout=120).json()
    if "choices" not in r:
        return f"llama-server refused the reply: {r['error']['message'][:70]}"
    msg, raw = r["choices"][0]["message"], r["__verbose"]["content"]
    ours = parse_message(
        raw,
        tool_names={"get_weather", "search"},
        parse_tools=tools,
        reasoning=body.get("reasoning_format") != "none",
        harmony=True,
    )
    theirs = (
        msg.get("content") or "",
        msg.get("reasoning_content") or "",
        [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls", [])],
    )
    same = theirs == (
        ours.content,
        ours.reasoning,
        [(c.name, c.arguments) for c in ours.tool_calls],
    )
    detail = "" if same else f"\n    llama: {theirs}\n    ours:  {ours}"
    return ("same  " if same else "DIFFERENT  ") + repr(raw[:90]) + detail


def main() -> None:
    server = sys.argv[1] if len(sys.argv) > 1 else BIN
    url = f"http://127.0.0.1:{PORT}"
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_gptoss(
            Path(tmp) / "m.gguf", qtype=GGMLQuantizationType.F32, n_ctx_train=4096
        )
        env = {**os.environ, "LD_LIBRARY_PATH": str(Path(server).parent)}
        proc = subprocess.Popen(
            [server, "-m", str(model), "--port", str(PORT), "-np", "1", "-c", "4096", "-t", "1"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(100):
                try:
                    if httpx.get(url + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            base = {
                "messages": [{"role": "user", "content": "Weather?"}],
                "max_tokens": 300,
                "temperature": 0,
            }
            for text in FORCED:
                for fmt in ("auto", "none"):
                    print(
                        f"forced, reasoning {fmt}:",
                        compare(
                            url, {**base, "grammar": grammar(text), "reasoning_format": fmt}, False
                        ),
                    )
            end = httpx.post(
                url + "/tokenize", json={"content": "<|end|>", "parse_special": True}
            ).json()["tokens"][0]
            for i, bias in enumerate((8.0, 2.0, 0.0, 3.0)):
                body = {
                    **base,
                    "messages": [{"role": "user", "content": "Weather?" * (i + 1)}],
                    "tools": TOOLS,
                    "tool_choice": "required",
                    "logit_bias": [[end, bias]],
                }
                print("tool_choice required:", compare(url, body, True))
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
