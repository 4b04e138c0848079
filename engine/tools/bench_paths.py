"""Decode speed through the paths a person uses, beside the engine's own (`bench --path`).

    engine   the context decoding greedily, one token per call (engine/tools/bench.py's tgN)
    http     `python -m engine serve` in a child process, N concurrent streaming /completion
             clients (server started with -np N), ignore_eos and a fixed n_predict
    gui      the desktop app's benchmark in a child process (its chat path; the engine never
             imports the app, so the command layer names the program: `python -m
             app.bench_gui --json`, engine/commands/bench.py), which prints one JSON line

Like llama-bench's tg, the http path times decoding only: a client's tokens/s is its tokens
after the first over the time from its first token to its last (the first token's wait is
the prompt). With several clients the aggregate counts the span in which all of them stream
(from the last client's first token to the first client's last one): N slots decoding together,
without a late client's prefill or an early client's absence at the end (aggregate_ts).
"""

from __future__ import annotations

import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import EngineError
from .bench import TimedSamples

PATHS = ("engine", "http", "gui")
PROMPT = "Once upon a time, in a small village by the sea,"
READY_TIMEOUT_S = 300.0  # a first start compiles the kernels (minutes on a busy 2-core machine)


@dataclass(frozen=True)
class PathResult(TimedSamples):
    """One path's decode speed: samples_ts is the (aggregate) tokens/s of each repetition."""

    path: str  # "http", "gui"
    n_gen: int
    n_threads: int
    n_clients: int
    samples_ts: list[float]
    per_client_ts: list[float] = field(default_factory=list)  # mean of the clients', per repetition
    extra: dict[str, Any] = field(
        default_factory=dict
    )  # what the path adds (gui: event_loop_p95_ms)

    @property
    def test(self) -> str:
        clients = f", {self.n_clients} clients" if self.n_clients > 1 else ""
        return f"tg{self.n_gen} ({self.path}{clients})"

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(
            path=self.path,
            test=self.test,
            n_prompt=0,
            n_gen=self.n_gen,
            n_depth=0,
            n_threads=self.n_threads,
            n_clients=self.n_clients,
            samples_ts=self.samples_ts,
            avg_ts=self.avg_ts,
            stddev_ts=self.stddev_ts,
        )
        if self.per_client_ts:
            d["per_client_ts"] = self.per_client_ts
            d["avg_per_client_ts"] = statistics.fmean(self.per_client_ts)
        d.update(self.extra)
        return d


def parse_paths(text: str) -> list[str]:
    """--path: one or more of engine, http, gui, comma-separated, in the order given."""
    paths = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in paths if p not in PATHS]
    if bad or not paths:
        raise ValueError(
            f"unknown path {', '.join(bad) or repr(text)}: expected {', '.join(PATHS)}"
        )
    return list(dict.fromkeys(paths))


# -- http ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamTiming:
    """When one streaming client got each token (perf_counter seconds), and when it sent the
    request (None when unknown)."""

    t_tokens: list[float]
    t_sent: float | None = None

    @property
    def n(self) -> int:
        return len(self.t_tokens)

    def decode_ts(self) -> float:
        """Tokens after the first over the time from the first to the last.

        A token's time is that of the read that brought it, so a client that was not scheduled
        while the server streamed gets every token in one read and sees no span between them:
        then the only span it observed, from sending the request to that read, gives a lower
        bound (a rate of 0 would say the server sent nothing)."""
        if self.n < 2:
            return 0.0
        t0, t1 = self.t_start, self.t_tokens[-1]
        return (self.n - 1) / (t1 - t0) if t1 > t0 else 0.0

    @property
    def t_start(self) -> float:
        """The first token's time, or the request's when every token came in one read."""
        if self.n >= 2 and self.t_tokens[-1] <= self.t_tokens[0] and self.t_sent is not None:
            return self.t_sent
        return self.t_tokens[0]


def aggregate_ts(streams: list[StreamTiming]) -> float:
    """Tokens/s of every client together while all of them stream: the tokens arriving after
    the last client's first token and up to the first client's last one, over that span. The
    clients' prompts, and a prefill of late ones batched with the others' decode steps, fall
    before it; a finished client's absence after it. With one client: its decode_ts()."""
    live = [s for s in streams if s.n >= 2]
    if not live:
        return 0.0
    t_a = max(s.t_tokens[0] for s in live)
    t_b = min(s.t_tokens[-1] for s in live)
    if t_b <= t_a:  # the streams did not overlap: every token after each first, over the whole span
        t_a, t_b = min(s.t_start for s in live), max(s.t_tokens[-1] for s in live)
        return sum(s.n - 1 for s in live) / (t_b - t_a) if t_b > t_a else 0.0
    n = sum(sum(1 for t in s.t_tokens if t_a < t <= t_b) for s in live)
    return n / (t_b - t_a)


class _ChunkedEvents:
    """Server-sent events out of an HTTP/1.1 chunked body, fed the socket's bytes as they come:
    feed() returns the complete events (b"data: ...") the new bytes finished."""

    def __init__(self) -> None:
        self._raw = b""  # bytes not yet de-chunked
        self._body = b""  # de-chunked bytes not yet a whole event
        self.ended = False  # the zero-length chunk came

    def feed(self, data: bytes) -> list[bytes]:
        self._raw += data
        while not self.ended:
            eol = self._raw.find(b"\r\n")
            if eol < 0:
                break
            size = int(self._raw[:eol].split(b";")[0], 16)
            end = eol + 2 + size
            if len(self._raw) < end + 2:
                break
            self._body += self._raw[eol + 2 : end]
            self._raw = self._raw[end + 2 :]
            self.ended = size == 0
        *events, self._body = self._body.split(b"\n\n")
        return events


def stream_completion(
    host: str, port: int, n_gen: int, seed: int, timeout_s: float = 600.0
) -> StreamTiming:
    """One streaming /completion request; the arrival time of each token's event.

    The client reads the socket itself (no http.client line reader): on a machine whose cores
    all decode, every millisecond the measuring client spends a token is taken from the server
    it measures (http.client cost ~0.4 ms a token here; this reader a tenth of that).

    Raises:
        EngineError: the server answered with an error, or the stream ended early.
    """
    body = json.dumps(
        {
            "prompt": PROMPT,
            "n_predict": n_gen,
            "ignore_eos": True,
            "stream": True,
            "seed": seed,
            "cache_prompt": False,
        }
    ).encode()
    head = (
        f"POST /completion HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    times: list[float] = []
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        t_sent = time.perf_counter()
        sock.sendall(head + body)
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            if not data:
                raise EngineError("the server closed the connection before answering")
            buf += data
        header, rest = buf.split(b"\r\n\r\n", 1)
        status = header.split(b"\r\n", 1)[0]
        if b" 200 " not in status + b" ":
            raise EngineError(
                f"the server answered {status.decode(errors='replace')}: {rest[:300]!r}"
            )
        if b"transfer-encoding: chunked" not in header.lower():
            raise EngineError("the server's stream is not chunked")
        events = _ChunkedEvents()
        data = rest
        while True:
            now = time.perf_counter()
            for ev in events.feed(data):
                if b'"stop":false' in ev:  # a token's event (compact JSON); the final one says true
                    times.append(now)
                elif b'"error"' in ev:
                    raise EngineError(f"the stream failed: {ev[6:].strip()[:300]!r}")
            if events.ended:
                break
            data = sock.recv(65536)
            if not data:
                break
    if len(times) != n_gen:
        raise EngineError(f"the stream ended after {len(times)} of {n_gen} tokens")
    return StreamTiming(times, t_sent)


def run_clients(
    host: str, port: int, n_clients: int, n_gen: int, seed: int = 0
) -> list[StreamTiming]:
    """n_clients concurrent streaming requests (one thread each, started together)."""
    results: list[StreamTiming | BaseException | None] = [None] * n_clients
    start = threading.Barrier(n_clients)

    def client(i: int) -> None:
        try:
            start.wait()
            results[i] = stream_completion(host, port, n_gen, seed + i)
        except BaseException as e:  # re-raised below, on the caller's thread
            results[i] = e

    threads = [
        threading.Thread(target=client, args=(i,), name=f"bench-client-{i}")
        for i in range(n_clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r if isinstance(r, EngineError) else EngineError(f"http client failed: {r}")
    return [r for r in results if isinstance(r, StreamTiming)]


# how a child process is put on a decode path (quants.DECODE_PATHS): its flags, and its
# environment without the shell's GGSTATION_INT8 / GGSTATION_NO_INT8 unless the path needs one
_PATH_FLAGS = {"x16": (), "int8": ("--int8",), "float": ("--no-int8",)}
_PATH_ENV = {"x16": {}, "int8": {"GGSTATION_INT8": "1"}, "float": {"GGSTATION_NO_INT8": "1"}}


def _path_env(decode_path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GGSTATION_INT8", "GGSTATION_NO_INT8")}
    return {**env, **_PATH_ENV[decode_path]}


class ServeProcess:
    """`python -m engine serve` on a free local port, in a child process (ends with the bench).

    The child runs with --ready-json: it reports its port on stdout and exits when its stdin
    closes, so it cannot outlive this process.
    """

    def __init__(
        self,
        model: str,
        n_slots: int,
        n_threads: int,
        n_ctx: int,
        decode_path: str = "x16",
        extra_args: tuple[str, ...] = (),
    ):
        cmd = [
            sys.executable,
            "-m",
            "engine",
            "serve",
            "-m",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--ready-json",
            "-np",
            str(n_slots),
            "-t",
            str(n_threads),
            "-c",
            str(n_ctx),
            "--no-slots",
            *_PATH_FLAGS[decode_path],
            *extra_args,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=os.getcwd(),
            env=_path_env(decode_path),
        )
        self._events: queue.Queue[dict | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.port = 0

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._events.put(json.loads(line))
            except ValueError:
                continue
        self._events.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr = (self._stderr + [line.rstrip()])[-20:]

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> int:
        """The port, once the model is loaded. Raises EngineError if the server fails or hangs."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ev = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise EngineError(f"the server did not become ready in {timeout_s:.0f} s") from None
            if ev is None or ev.get("event") == "failed":
                self.proc.wait(5)
                tail = "\n".join(self._stderr[-5:])
                raise EngineError(
                    f"the server did not start ({ev.get('error') if ev else 'it exited'}):\n{tail}"
                )
            if ev.get("event") == "listening":
                self.port = int(ev["port"])
            if ev.get("event") == "ready":
                self.port = int(ev["port"])
                return self.port

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # the child's monitor exits on EOF
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def bench_http(
    model: str,
    n_gen: int,
    reps: int,
    n_threads: int,
    n_clients: int = 1,
    decode_path: str = "x16",
    server: tuple[str, int] | None = None,
) -> PathResult:
    """Decode tokens/s of n_clients concurrent streaming clients, reps timed rounds after a
    warm-up round. Starts a server with -np n_clients unless `server` (host, port) is given."""
    if n_gen < 2:
        raise EngineError("the http path needs -n 2 or more (it times the tokens after the first)")
    proc = None
    if server is None:
        n_ctx = n_clients * (n_gen + 64)  # each slot: the short prompt and the reply
        proc = ServeProcess(model, n_clients, n_threads, n_ctx, decode_path)
        try:
            server = ("127.0.0.1", proc.wait_ready())
        except BaseException:
            proc.stop()
            raise
    try:
        host, port = server
        run_clients(host, port, n_clients, min(n_gen, 8))  # warm-up: every batch shape once
        samples, per_client = [], []
        for rep in range(reps):
            streams = run_clients(host, port, n_clients, n_gen, seed=1000 * rep)
            samples.append(aggregate_ts(streams))
            per_client.append(statistics.fmean(s.decode_ts() for s in streams))
    finally:
        if proc is not None:
            proc.stop()
    return PathResult("http", n_gen, n_threads, n_clients, samples, per_client)


# -- gui -----------------------------------------------------------------------------------------


def bench_gui(
    command: list[str],
    n_gen: int,
    n_threads: int,
    timeout_s: float = 1800.0,
    decode_path: str = "x16",
) -> PathResult:
    """The desktop app's chat decode speed, from its benchmark program's JSON line.

    Args:
        command: the program and its arguments (`python -m app.bench_gui ... --json`); a
            `python -m MODULE` whose module is missing is said so.

    Raises:
        EngineError: the module is missing, failed, or printed no JSON line.
    """
    cmd = command
    env = _path_env(decode_path)
    if not env.get("DISPLAY") and not env.get("WAYLAND_DISPLAY"):
        env.setdefault("QT_QPA_PLATFORM", "offscreen")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise EngineError(f"the gui benchmark did not finish in {timeout_s:.0f} s") from None
    if done.returncode != 0:
        err = done.stderr.strip().splitlines()
        module = cmd[2] if len(cmd) > 2 and cmd[1] == "-m" else None
        if module and any(
            "No module named" in line and module.split(".")[-1] in line for line in err[-3:]
        ):
            raise EngineError(
                f"the gui path needs the desktop app's benchmark ({module}), which this "
                "installation does not have"
            )
        last = err[-1] if err else f"exit code {done.returncode}"
        raise EngineError(f"the gui benchmark failed: {last}")
    return parse_gui_output(done.stdout, n_gen, n_threads)


def parse_gui_output(stdout: str, n_gen: int, n_threads: int) -> PathResult:
    """The PathResult of the gui benchmark's one JSON line (the last line that parses)."""
    row = None
    for line in reversed(stdout.strip().splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            break
        row = None
    if row is None:
        raise EngineError("the gui benchmark printed no JSON result")
    samples = row.get("samples_ts")
    if (
        not isinstance(samples, list)
        or not samples
        or not all(isinstance(v, (int, float)) for v in samples)
    ):
        raise EngineError(f"the gui benchmark's result has no samples_ts: {stdout.strip()[:200]}")
    known = {"path", "samples_ts", "avg_ts", "stddev_ts", "n_gen", "n_threads", "test"}
    extra = {k: v for k, v in row.items() if k not in known}
    return PathResult(
        "gui",
        int(row.get("n_gen", n_gen)),
        int(row.get("n_threads", n_threads)),
        1,
        [float(v) for v in samples],
        extra=extra,
    )
