"""Memory growth under hostile HTTP (not collected by pytest): python tests/bench_memory.py [OPTIONS]

Starts a server (or uses --url/--pid) and sends rounds of valid requests mixed with hostile
ones: malformed JSON, invalid UTF-8, wrong types, deep nesting, huge strings (unique per
round unless --same-every-round), bodies over the size limit, out-of-range token ids, a
thousand messages, unknown paths, streams dropped after two chunks, and many at once.
After each round it prints the server's RSS, its peak, thread and file-descriptor counts,
and at the end the growth per round over the second half of the rounds. A leak grows
by about the same amount every round; a plateau (weights and KV cache paged in on first use,
bounded caches, free space the allocator keeps) stops growing. --kinds picks hostile kinds,
--env changes the allocator of a started server.

    python tests/bench_memory.py --server ggstation -m smollm2 -np 4 -t 2 --rounds 10
    python tests/bench_memory.py ... --env MALLOC_ARENA_MAX=2     # glibc arenas held back
    python tests/bench_memory.py ... --env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import string
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench_load import ServerProcess, add_server_arguments, make_jobs, rss_mib, run_clients

CHAT = "/v1/chat/completions"
# kind -> weight in the mix; the huge_* kinds and many_messages carry 0.1-1 MB bodies
KINDS = {
    "malformed_json": 6,
    "invalid_utf8": 3,
    "wrong_types": 8,
    "deep_nesting": 1,
    "huge_prompt": 1,
    "huge_chat": 1,
    "huge_word": 1,
    "huge_field": 1,
    "over_limit": 1,
    "bad_tokens": 3,
    "many_messages": 1,
    "big_logit_bias": 1,
    "unknown_path": 3,
    "wrong_method": 3,
    "dropped_stream": 2,
}


@dataclass(frozen=True)
class Hostile:
    name: str
    path: str
    content: bytes | None
    method: str = "POST"
    drop_stream: bool = False  # read two chunks of a stream, then hang up


def _words(rng: random.Random, n_chars: int) -> str:
    letters = string.ascii_lowercase
    out, size = [], 0
    while size < n_chars:
        w = "".join(rng.choices(letters, k=rng.randint(2, 12)))
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


def hostile_requests(rng: random.Random, n: int, kinds: tuple[str, ...] = ()) -> list[Hostile]:
    """n hostile requests drawn from KINDS (or the given ones); sizes and contents from rng."""
    valid = _j({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4})

    def make(kind: str) -> Hostile:
        big = rng.randint(100_000, 1_000_000)
        match kind:
            case "malformed_json":
                return Hostile(kind, CHAT, valid[: rng.randint(1, len(valid) - 2)])
            case "invalid_utf8":
                return Hostile(kind, "/completion", b'{"prompt": "abc\xff\xfe\xc3"}')
            case "wrong_types":
                body = rng.choice(
                    [
                        {"messages": "hi"},
                        {"prompt": 5, "n_predict": "x"},
                        {"prompt": "a", "temperature": [1]},
                        {"messages": [{"role": 3, "content": {"a": 1}}]},
                        [1, 2, 3],
                        "text",
                        None,
                        {"prompt": "a", "n_predict": 2**70},
                        {"prompt": "a", "logit_bias": "x"},
                    ]
                )
                return Hostile(
                    kind,
                    rng.choice([CHAT, "/completion", "/v1/completions", "/tokenize"]),
                    _j(body),
                )
            case "deep_nesting":
                depth = rng.randint(10_000, 200_000)
                return Hostile(kind, rng.choice([CHAT, "/completion"]), b"[" * depth + b"]" * depth)
            case "huge_prompt":  # far over the context: tokenized, then refused
                return Hostile(
                    kind, "/completion", _j({"prompt": _words(rng, big), "n_predict": 4})
                )
            case "huge_chat":
                return Hostile(
                    kind, CHAT, _j({"messages": [{"role": "user", "content": _words(rng, big)}]})
                )
            case "huge_word":  # one pre-tokenizer word of random letters
                word = "".join(rng.choices(string.ascii_letters, k=rng.randint(10_000, 200_000)))
                return Hostile(kind, "/tokenize", _j({"content": word}))
            case "huge_field":
                return Hostile(
                    kind,
                    CHAT,
                    _j(
                        {
                            "messages": [{"role": "user", "content": "hi"}],
                            "model": "m" * big,
                            "stop": ["s" * 1000] * 16,
                            "max_tokens": 2,
                        }
                    ),
                )
            case "over_limit":
                return Hostile(kind, "/completion", b'{"prompt": "' + b"a" * (9 << 20) + b'"}')
            case "bad_tokens":
                return Hostile(kind, "/completion", _j({"prompt": [10**9, -1, 5], "n_predict": 2}))
            case "many_messages":
                msgs = [
                    {"role": rng.choice(["user", "assistant"]), "content": _words(rng, 20)}
                    for _ in range(1000)
                ]
                return Hostile(kind, CHAT, _j({"messages": msgs, "max_tokens": 2}))
            case "big_logit_bias":
                return Hostile(
                    kind,
                    "/completion",
                    _j(
                        {
                            "prompt": "hi",
                            "n_predict": 2,
                            "logit_bias": {str(i): -1.0 for i in range(50_000)},
                        }
                    ),
                )
            case "unknown_path":
                return Hostile(
                    kind, rng.choice(["/v1/nothing", "/completion/x", "/" + "p" * 5000]), valid
                )
            case "wrong_method":
                return Hostile(kind, rng.choice([CHAT, "/completion"]), None, method="GET")
            case "dropped_stream":
                body = {"prompt": _words(rng, 200), "n_predict": 200, "stream": True}
                return Hostile(kind, "/completion", _j(body), drop_stream=True)
        raise ValueError(kind)

    chosen = [k for k in KINDS if not kinds or k in kinds]
    return [make(k) for k in rng.choices(chosen, [KINDS[k] for k in chosen], k=n)]


async def send_hostile(client: httpx.AsyncClient, h: Hostile) -> str:
    """The status code (or exception name) the server's answer came with."""
    headers = {"content-type": "application/json"}
    try:
        async with client.stream(h.method, h.path, content=h.content, headers=headers) as r:
            if h.drop_stream and r.status_code == 200:
                n = 0
                async for _ in r.aiter_lines():
                    n += 1
                    if n >= 4:
                        break
                return "200 dropped"
            await r.aread()
            return str(r.status_code)
    except httpx.HTTPError as e:
        return type(e).__name__


async def hostile_round(
    url: str, requests: list[Hostile], concurrency: int, timeout: float
) -> Counter:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:

        async def one(h: Hostile) -> tuple[str, str]:
            async with gate:
                return h.name, await send_hostile(client, h)

        return Counter(await asyncio.gather(*(one(h) for h in requests)))


def proc_counts(pid: int | None) -> dict[str, int]:
    if pid is None:
        return {}
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(
        next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1]
    )
    return {"threads": threads, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def slope(ys: list[float]) -> float:
    """Least-squares growth per step."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))


async def one_round(url: str, args: argparse.Namespace, r: int) -> tuple[Counter, Counter]:
    seed = args.seed if args.same_every_round else args.seed + r
    hostile = hostile_requests(random.Random(seed), args.hostile, args.kinds)
    jobs = make_jobs(args.clients, args.valid, seed, 16, 64, 0.0)
    (outcomes, _), statuses = await asyncio.gather(
        run_clients(url, jobs, args.timeout),
        hostile_round(url, hostile, args.concurrency, args.timeout),
    )
    return Counter(o.error or "ok" for o in outcomes), statuses


def run_rounds(url: str, pid: int | None, args: argparse.Namespace) -> list[dict]:
    rows = [{"round": 0, **rss_mib(pid), **proc_counts(pid)}]
    print(
        f"round  seconds  VmRSS MiB  (delta)  VmHWM MiB  threads  fds   valid / hostile answers "
        f"(load {os.getloadavg()[0]:.1f})"
    )
    print(f"{0:>5}  {'':>7}  {rows[0].get('VmRSS', 0):9.1f}")
    statuses_all: Counter = Counter()
    for r in range(1, args.rounds + 1):
        t0 = time.perf_counter()
        valid, statuses = asyncio.run(one_round(url, args, r))
        time.sleep(args.settle)
        row = {
            "round": r,
            "seconds": time.perf_counter() - t0,
            **rss_mib(pid),
            **proc_counts(pid),
            "valid": dict(valid),
            "hostile": {f"{k} {s}": n for (k, s), n in statuses.items()},
        }
        rows.append(row)
        statuses_all.update(statuses)
        bad = {k: v for k, v in valid.items() if k != "ok"}
        delta = row.get("VmRSS", 0) - rows[-2].get("VmRSS", 0)
        print(
            f"{r:>5}  {row['seconds']:7.1f}  {row.get('VmRSS', 0):9.1f}  ({delta:+6.1f})  {row.get('VmHWM', 0):9.1f}"
            f"  {row.get('threads', 0):7}  {row.get('fds', 0):3}   ok {valid.get('ok', 0)} {bad or ''}"
            f" / 5xx {sum(n for (_, s), n in statuses.items() if s.startswith('5'))}",
            flush=True,
        )
    by_status = Counter()
    for (kind, status), n in statuses_all.items():
        by_status[f"{kind}: {status}"] += n
    print(
        "hostile answers over all rounds: "
        + ", ".join(f"{k} x{v}" for k, v in sorted(by_status.items()))
    )
    rss = [row.get("VmRSS", 0.0) for row in rows[1:]]
    half = rss[len(rss) // 2 :]
    print(
        f"growth per round: {slope(rss):+.2f} MiB over all rounds, {slope(half):+.2f} MiB over the second half"
    )
    return rows


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    add_server_arguments(p)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--hostile", type=int, default=440, help="hostile requests per round")
    p.add_argument("--concurrency", type=int, default=32, help="hostile requests in flight at once")
    p.add_argument("--clients", type=int, default=4, help="valid clients per round")
    p.add_argument("--valid", type=int, default=4, help="valid requests per client per round")
    p.add_argument(
        "--kinds",
        type=lambda v: tuple(v.split(",")),
        default=(),
        help=f"hostile kinds to send, comma-separated (default: all of {', '.join(KINDS)})",
    )
    p.add_argument(
        "--same-every-round", action="store_true", help="repeat round 1's requests (no new strings)"
    )
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--settle", type=float, default=1.0, help="seconds to wait before reading RSS")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for a started server")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    if unknown := set(args.kinds) - set(KINDS):
        p.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.url:
        rows = run_rounds(args.url.rstrip("/"), args.pid, args)
    else:
        env = dict(e.split("=", 1) for e in args.env)
        with ServerProcess(args, env) as server:
            rows = run_rounds(server.url, server.pid, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
