"""Load generator (not collected by pytest): python tests/bench_load.py [--url URL | --server KIND -m MODEL]

N clients (default 16) each send M requests (default 30) one after another, a seeded mix of
streaming and non-streaming chat (/v1/chat/completions) and completions (/completion), each
asking for 16-64 tokens at temperature 0 unless told otherwise. Prints failures by kind, wall
time, requests/s, generated tokens/s, p50/p95 latency, p50/p95 time to first token of the
streamed ones, and the server's RSS before and after (VmRSS, and VmHWM: the peak).

Against a running server give --url (and --pid for its RSS); or let the script start one:

    python tests/bench_load.py --server ggstation -m smollm2 -np 4 -t 2
    python tests/bench_load.py --server llama-server --server-bin PATH/llama-server \\
        -m smollm2 -np 4 -t 2 -c 4096

Both speak llama-server's /completion and OpenAI's /v1/chat/completions, so the same run
compares them. Match the context per slot (n_ctx / np; printed as n_ctx_seq from /props).
Figures are of this machine at this moment: compare runs on a quiet machine, not machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("chat_stream", "chat", "completion", "completion_stream")
PROMPTS = (
    "Write a short poem about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three uses of a paperclip.",
    "What is the capital of France, and why is it famous?",
    "Describe a sunrise to someone who has never seen one.",
    "Give me a recipe for a simple tomato soup.",
    "Why is the sky blue?",
    "Summarise the plot of a heist movie you invent.",
    "Translate 'good morning, how are you' into Spanish and French.",
    "Tell a one-paragraph story about a robot learning to paint.",
    "What are the rules of tic-tac-toe?",
    "Suggest five names for a coffee shop.",
)


@dataclass(frozen=True)
class Job:
    kind: str
    prompt: str
    n_predict: int
    temperature: float
    seed: int


@dataclass
class Outcome:
    kind: str
    latency: float = 0.0
    ttft: float | None = None  # seconds to the first non-empty text delta (streams only)
    n_gen: int = 0
    error: str | None = None


def make_jobs(
    n_clients: int,
    n_requests: int,
    seed: int,
    n_min: int,
    n_max: int,
    temperature: float,
    kinds: tuple[str, ...] = KINDS,
) -> list[list[Job]]:
    """Each client's requests, the same for the same seed."""
    rng = random.Random(seed)
    return [
        [
            Job(
                rng.choice(kinds),
                rng.choice(PROMPTS),
                rng.randint(n_min, n_max),
                temperature,
                rng.randrange(2**31),
            )
            for _ in range(n_requests)
        ]
        for _ in range(n_clients)
    ]


def request_for(job: Job) -> tuple[str, dict]:
    """(path, JSON body) of one job."""
    stream = job.kind.endswith("_stream")
    common = {"temperature": job.temperature, "seed": job.seed, "stream": stream}
    if job.kind.startswith("chat"):
        body = {
            "messages": [{"role": "user", "content": job.prompt}],
            "max_tokens": job.n_predict,
            **common,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return "/v1/chat/completions", body
    return "/completion", {"prompt": job.prompt, "n_predict": job.n_predict, **common}


def _generated(data: dict) -> int | None:
    """Tokens generated according to a final answer or chunk, if it says."""
    usage = data.get("usage")
    if isinstance(usage, dict) and "completion_tokens" in usage:
        return int(usage["completion_tokens"])
    if "tokens_predicted" in data:
        return int(data["tokens_predicted"])
    timings = data.get("timings")
    if isinstance(timings, dict) and "predicted_n" in timings:
        return int(timings["predicted_n"])
    return None


def _delta_text(data: dict) -> str:
    choices = data.get("choices") or []
    if choices:
        delta = choices[0].get("delta") or {}
        return delta.get("content") or ""
    return data.get("content") or ""


async def _read_stream(response: httpx.Response, out: Outcome, t0: float) -> None:
    chunks, finished = 0, False
    async for line in response.aiter_lines():
        if line.startswith("error:"):
            raise RuntimeError(f"error event: {line[6:].strip()[:80]}")
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            finished = True
            break
        data = json.loads(payload)
        if "error" in data:
            raise RuntimeError(f"error event: {str(data['error'])[:80]}")
        if _delta_text(data):
            chunks += 1
            if out.ttft is None:
                out.ttft = time.perf_counter() - t0
        n = _generated(data)
        if n is not None:
            out.n_gen = n
        if data.get("stop") is True:  # /completion's last chunk; it sends no [DONE]
            finished = True
    if not finished:
        raise RuntimeError("stream ended early")
    out.n_gen = out.n_gen or chunks


async def run_job(client: httpx.AsyncClient, job: Job) -> Outcome:
    """Send one request; never raises (the error goes into the Outcome)."""
    path, body = request_for(job)
    out = Outcome(job.kind)
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                out.error = f"HTTP {response.status_code}"
            elif body["stream"]:
                await _read_stream(response, out, t0)
            else:
                n = _generated(json.loads(await response.aread()))
                out.n_gen = n if n is not None else 0
        if out.error is None and out.n_gen == 0:
            out.error = "no tokens generated"
    except (httpx.HTTPError, RuntimeError, ValueError) as e:
        out.error = f"{type(e).__name__}: {str(e)[:60]}" if str(e) else type(e).__name__
    out.latency = time.perf_counter() - t0
    return out


async def run_clients(
    url: str, jobs: list[list[Job]], timeout: float, keep_alive: bool = True
) -> tuple[list[Outcome], float]:
    """Run every client's jobs concurrently; returns the outcomes and the wall time."""
    limits = httpx.Limits(
        max_connections=len(jobs), max_keepalive_connections=len(jobs) if keep_alive else 0
    )
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:

        async def one_client(mine: list[Job]) -> list[Outcome]:
            return [await run_job(client, job) for job in mine]

        t0 = time.perf_counter()
        per_client = await asyncio.gather(*(one_client(mine) for mine in jobs))
        return [o for outs in per_client for o in outs], time.perf_counter() - t0


# --- figures -------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan when empty."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarise(outcomes: list[Outcome], wall: float) -> dict:
    ok = [o for o in outcomes if o.error is None]
    lat = [o.latency for o in ok]
    ttft = [o.ttft for o in ok if o.ttft is not None]
    n_gen = sum(o.n_gen for o in ok)
    return {
        "requests": len(outcomes),
        "ok": len(ok),
        "failures": len(outcomes) - len(ok),
        "failure_kinds": dict(Counter(o.error for o in outcomes if o.error is not None)),
        "wall_s": wall,
        "requests_per_s": len(ok) / wall,
        "generated_tokens": n_gen,
        "generated_tokens_per_s": n_gen / wall,
        "latency_p50_s": percentile(lat, 0.5),
        "latency_p95_s": percentile(lat, 0.95),
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p95_s": percentile(ttft, 0.95),
        "by_kind": {
            k: {"n": len(v), "latency_p50_s": percentile(v, 0.5)}
            for k in KINDS
            if (v := [o.latency for o in ok if o.kind == k])
        },
    }


def rss_mib(pid: int | None) -> dict[str, float]:
    """{'VmRSS': MiB, 'VmHWM': MiB} of a process (Linux /proc), empty without a pid."""
    if pid is None:
        return {}
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def print_report(s: dict, rss: dict[str, dict[str, float]], props: dict) -> None:
    print(f"server: n_ctx_seq {props.get('n_ctx_seq', '?')}, slots {props.get('total_slots', '?')}")
    print(
        f"requests {s['requests']}, ok {s['ok']}, failures {s['failures']} {s['failure_kinds'] or ''}"
    )
    print(
        f"wall {s['wall_s']:.1f} s, {s['requests_per_s']:.2f} req/s, "
        f"{s['generated_tokens']} tokens generated, {s['generated_tokens_per_s']:.1f} tok/s"
    )
    print(
        f"latency p50 {s['latency_p50_s']:.2f} s, p95 {s['latency_p95_s']:.2f} s; "
        f"time to first token (streams) p50 {s['ttft_p50_s']:.2f} s, p95 {s['ttft_p95_s']:.2f} s"
    )
    print(
        "latency p50 by kind: "
        + ", ".join(f"{k} {v['latency_p50_s']:.2f} s (n={v['n']})" for k, v in s["by_kind"].items())
    )
    for when, r in rss.items():
        if r:
            print(f"RSS {when:<13} {r['VmRSS']:7.1f} MiB (peak {r['VmHWM']:.1f} MiB)")


# --- the server under test -----------------------------------------------------------------


def resolve_model(arg: str) -> str:
    """A path as given, or a starter-model name (smollm2) resolved to its file."""
    if Path(arg).is_file():
        return arg
    sys.path.insert(0, str(ROOT))
    from engine.hub import store as model_store

    return str(model_store.resolve_model_arg(arg))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """Start `ggstation serve` or `llama-server`, wait until /health says 200, stop on exit."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str] | None = None):
        self.port = args.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        model = resolve_model(args.model)
        if args.server == "ggstation":
            cmd = [sys.executable, "-m", "engine", "serve"]
        else:
            cmd = [args.server_bin or "llama-server"]
        cmd += [
            "-m",
            model,
            "-np",
            str(args.parallel),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        cmd += ["-t", str(args.threads)] if args.threads else []
        cmd += ["-c", str(args.ctx_size)] if args.ctx_size else []
        self.cmd = cmd + shlex.split(args.server_args)
        self.log_path = args.server_log or tempfile.mktemp(prefix=f"{args.server}-", suffix=".log")
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        print(f"starting: {shlex.join(self.cmd)}  (log: {self.log_path})", flush=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 900:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}; see {self.log_path}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    print(f"ready after {time.perf_counter() - t0:.1f} s", flush=True)
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"server not ready after 900 s; see {self.log_path}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def server_props(url: str) -> dict:
    """n_ctx_seq and total_slots from /props (both servers answer it)."""
    try:
        p = httpx.get(url + "/props", timeout=10).json()
        return {
            "n_ctx_seq": p["default_generation_settings"]["n_ctx"],
            "total_slots": p.get("total_slots"),
        }
    except (httpx.HTTPError, ValueError, KeyError):
        return {}


# --- command line --------------------------------------------------------------------------


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="a running server (default: start one with --server)")
    p.add_argument("--pid", type=int, help="the running server's process id, for its RSS")
    p.add_argument("--server", choices=["ggstation", "llama-server"], default="ggstation")
    p.add_argument("--server-bin", help="llama-server's path (default: llama-server on PATH)")
    p.add_argument("--server-args", default="", help="more flags for the server, one string")
    p.add_argument(
        "--server-log", help="where the started server's output goes (default: a temp file)"
    )
    p.add_argument("-m", "--model", default="smollm2", help="GGUF path or starter-model name")
    p.add_argument("-np", "--parallel", type=int, default=4)
    p.add_argument("-t", "--threads", type=int, default=0, help="server threads (default: its own)")
    p.add_argument(
        "-c", "--ctx-size", type=int, default=0, help="server context (default: its own)"
    )
    p.add_argument(
        "--port", type=int, default=0, help="port of a started server (default: a free one)"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter
    )
    add_server_arguments(p)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=30, help="requests per client")
    p.add_argument("--min-tokens", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--warmup", type=int, default=4, help="sequential requests before the run, not counted"
    )
    p.add_argument("--timeout", type=float, default=600, help="seconds per request")
    p.add_argument(
        "--no-keep-alive",
        dest="keep_alive",
        action="store_false",
        help="a new connection per request (default: pooled keep-alive connections)",
    )
    p.add_argument("--json", help="also write the figures to this file")
    return p.parse_args(argv)


def measure(url: str, pid: int | None, args: argparse.Namespace) -> dict:
    rss = {"at start": rss_mib(pid)}
    warm = make_jobs(
        1, args.warmup, args.seed + 1, args.min_tokens, args.max_tokens, args.temperature
    )
    asyncio.run(run_clients(url, warm, args.timeout, args.keep_alive))
    rss["after warm-up"] = rss_mib(pid)
    jobs = make_jobs(
        args.clients, args.requests, args.seed, args.min_tokens, args.max_tokens, args.temperature
    )
    outcomes, wall = asyncio.run(run_clients(url, jobs, args.timeout, args.keep_alive))
    rss["after run"] = rss_mib(pid)
    figures = summarise(outcomes, wall)
    props = server_props(url)
    print(
        f"\n{args.clients} clients x {args.requests} requests, {args.min_tokens}-{args.max_tokens} tokens, "
        f"temperature {args.temperature}, seed {args.seed}, load average {os.getloadavg()[0]:.2f}"
    )
    print_report(figures, rss, props)
    return {**figures, "rss_mib": rss, "server": props}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.url:
        figures = measure(args.url.rstrip("/"), args.pid, args)
    else:
        with ServerProcess(args) as server:
            figures = measure(server.url, server.pid, args)
            figures["command"] = server.cmd
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 1 if figures["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
