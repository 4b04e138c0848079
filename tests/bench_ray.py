"""serve --ray against the single-process server (not collected by pytest):

    python tests/bench_ray.py [-m MODEL] [--clients 4] [--requests 3] [-n 64]

Starts, one after the other on this machine:
1. `python -m engine serve -m MODEL -np 4 -t 2`, then `-t 1` (one process, one engine, 4 slots);
2. `python -m engine serve --ray` (a local Ray instance) with the same model as two presets,
   one deployment of 1 replica and one of 2 replicas, each replica `-np 4 -t 1`; loaded in
   turn (--models-max 1).
For each: N concurrent streaming chat clients, each sending R requests of n tokens (EOS
ignored, temperature 0), give the aggregate generated tokens/s; and 10 sequential one-token
requests on a short prompt give the median time to first token (the added latency of the
Ray ingress is the difference). Figures are of this machine at this moment: on a shared
machine they move with the other load, so compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = Path.home() / ".local/share/ggstation/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str], url: str, timeout: float = 180) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", *argv],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve {' '.join(argv)} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"serve {' '.join(argv)} did not come up")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


async def stream_one(
    client: httpx.AsyncClient, url: str, model: str, prompt: str, n: int
) -> tuple[float, int]:
    """(time to first content, generated tokens) of one streamed chat request."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": n,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft, tokens = float("nan"), 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if "error" in data:
                raise RuntimeError(data["error"])
            if data.get("choices") and data["choices"][0]["delta"].get("content") and ttft != ttft:
                ttft = time.perf_counter() - t0
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
    return ttft, tokens


async def throughput(url: str, model: str, clients: int, requests: int, n: int) -> float:
    async with httpx.AsyncClient(timeout=600) as client:
        await stream_one(client, url, model, "warm up", 8)

        async def one_client(i: int) -> int:
            return sum(
                [
                    (await stream_one(client, url, model, f"Tell me a story number {i}-{k}.", n))[1]
                    for k in range(requests)
                ]
            )

        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one_client(i) for i in range(clients))))
        return tokens / (time.perf_counter() - t0)


async def ttft(url: str, model: str, k: int = 10) -> float:
    async with httpx.AsyncClient(timeout=120) as client:
        await stream_one(client, url, model, "Hi", 1)
        return statistics.median(
            [(await stream_one(client, url, model, "Hi", 1))[0] for _ in range(k)]
        )


def load(url: str, model: str) -> None:
    r = httpx.post(url + "/models/load", json={"model": model}, timeout=120)
    r.raise_for_status()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        models = httpx.get(url + "/models", timeout=10).json()["data"]
        status = next(m["status"] for m in models if m["id"] == model)
        if status["value"] == "loaded":
            return
        if status.get("failed"):
            raise SystemExit(f"{model} failed: {status}")
        time.sleep(1)
    raise SystemExit(f"{model} did not load")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default=str(DEFAULT_MODEL))
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=3)
    p.add_argument("-n", type=int, default=64, help="tokens per request")
    args = p.parse_args(argv)
    rows: list[tuple[str, float, float]] = []

    for threads in (2, 1):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start(
            ["-m", args.model, "-np", "4", "-t", str(threads), "-c", "4096", "--port", str(port)],
            url,
        )
        try:
            name = Path(args.model).name
            rows.append(
                (
                    f"single process, -np 4 -t {threads}",
                    asyncio.run(throughput(url, name, args.clients, args.requests, args.n)),
                    asyncio.run(ttft(url, name)),
                )
            )
        finally:
            stop(proc)

    with tempfile.TemporaryDirectory() as d:
        preset = Path(d) / "preset.ini"
        preset.write_text(
            "[*]\nparallel = 4\nthreads = 1\nctx-size = 4096\n\n"
            f"[r1]\nmodel = {args.model}\n\n"
            f"[r2]\nmodel = {args.model}\nmin-replicas = 2\nmax-replicas = 2\n"
        )
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env_dir = Path(d) / "store"
        os.environ.setdefault("GGSTATION_MODELS_DIR", str(env_dir))
        proc = start(
            [
                "--ray",
                "--port",
                str(port),
                "--models-preset",
                str(preset),
                "--models-max",
                "1",
                "--no-models-autoload",
            ],
            url,
        )
        try:
            for model, label in (
                ("r1", "Ray Serve, 1 replica -np 4 -t 1"),
                ("r2", "Ray Serve, 2 replicas -np 4 -t 1"),
            ):
                load(url, model)
                rows.append(
                    (
                        label,
                        asyncio.run(throughput(url, model, args.clients, args.requests, args.n)),
                        asyncio.run(ttft(url, model)),
                    )
                )
        finally:
            stop(proc)

    print(
        f"\n{args.clients} streaming clients x {args.requests} requests x {args.n} tokens; "
        f"{os.cpu_count()} CPUs; model {Path(args.model).name}"
    )
    print(f"{'server':40s} {'tokens/s':>9s} {'TTFT ms':>8s}")
    for label, tps, t in rows:
        print(f"{label:40s} {tps:9.1f} {t * 1e3:8.1f}")
    base = rows[1][2]  # the single process at one thread, as each replica runs
    for label, _, t in rows[2:]:
        print(f"added TTFT of {label} (vs the single process at -t 1): {(t - base) * 1e3:+.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
