"""A bounded "long hostile run" against `ggstation serve`: status codes, liveness and RSS.

Starts `python -m engine serve -m MODEL --port FREE -np 2 --slot-save-path TMPDIR
--ui-mcp-proxy` as a subprocess (in --cwd, with PYTHONPATH=--cwd, so that an older snapshot
of the tree can be run the same way), waits for /health, then for --rounds rounds (or until
--max-seconds) sends a fixed mix of hostile requests to 127.0.0.1 only:

- grammar bombs: a 5000-rule GBNF chain, a 5000-rule Lark chain, a 2000-deep JSON-schema
  $ref chain (in /completion, in chat `response_format` and in /v1/responses `text.format`),
  `"x"{1000000}`, a 1 MB literal;
- huge integers (2**70 as min_keep, seed, top_k, n_probs, a token id, a slot id);
- /slots bodies nested 100000 deep, slot save/restore with odd file names (255 and 300
  characters, `..`, `../x`, a directory's name, a NUL, a number);
- /cors-proxy with `http://0177.0.0.1/`, port 99999, a CRLF in the URL, `http://⒈.example/`,
  and to a local http.server started here, with and without `Origin: http://evil.example`;
- malformed JSON, bodies nested 100000 deep, a prompt longer than the context.

A second client thread sends normal completions (n_predict 8) all along; they must keep
succeeding. Per request class the script counts 2xx/4xx/5xx/timeouts/connection errors,
checks after every round that the server is still alive (if not: its exit code, and stop),
and reads the server's VmRSS and VmHWM (peak) from /proc after start-up, after round 1 and
at the end. Every request has a timeout; at most two clients at a time.

Run (from the repository root):

    python scripts/hostile_run.py --rounds 5 --max-seconds 200
    python scripts/hostile_run.py --cwd /tmp/old-tree --rounds 5 --json /tmp/old.json

Exit status: 0 if the server survived and no request got a 5xx or a connection error,
1 otherwise, 2 if the server did not start.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

DEFAULT_MODEL = Path.home() / ".local/share/ggstation/models/SmolLM2-135M-Instruct.Q4_1.gguf"
HUGE = 2**70
NORMAL = "normal"


# -- bookkeeping --------------------------------------------------------------------------------


@dataclass
class ClassStats:
    """What one request class got over the run."""

    n: int = 0
    ok: int = 0  # 2xx
    c4xx: int = 0
    c5xx: int = 0
    timeout: int = 0
    conn: int = 0
    other: int = 0
    codes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    max_s: float = 0.0
    first_5xx: str = ""

    def add(self, outcome: str, seconds: float, body: str = "") -> None:
        self.n += 1
        self.codes[outcome] += 1
        self.max_s = max(self.max_s, seconds)
        if outcome == "timeout":
            self.timeout += 1
        elif outcome == "conn":
            self.conn += 1
        elif outcome[0] == "2":
            self.ok += 1
        elif outcome[0] == "4":
            self.c4xx += 1
        elif outcome[0] == "5":
            self.c5xx += 1
            if not self.first_5xx:
                self.first_5xx = body[:200]
        else:
            self.other += 1


class Recorder:
    def __init__(self) -> None:
        self.stats: dict[str, ClassStats] = defaultdict(ClassStats)
        self.lock = threading.Lock()

    def send(self, client: httpx.Client, name: str, method: str, path: str, **kw: Any) -> str:
        t0 = time.monotonic()
        body = ""
        try:
            r = client.request(method, path, **kw)
            outcome, body = str(r.status_code), r.text
        except httpx.TimeoutException:
            outcome = "timeout"
        except httpx.TransportError as e:
            outcome, body = "conn", repr(e)
        with self.lock:
            self.stats[name].add(outcome, time.monotonic() - t0, body)
        return outcome


# -- the server under test ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB; {} if it is gone."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def engine_file(cwd: str, env: dict[str, str]) -> str:
    """Which engine package `python -m engine` imports in this cwd and environment."""
    done = subprocess.run(
        [sys.executable, "-c", "import engine; print(engine.__file__)"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return (done.stdout or done.stderr).strip()


def start_server(
    args: argparse.Namespace, save_dir: str, log_path: str
) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": args.cwd}
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "serve",
        "-m",
        args.model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-np",
        "2",
        "-c",
        str(args.ctx),
        "-t",
        str(args.threads),
        "--slot-save-path",
        save_dir,
        "--ui-mcp-proxy",
    ]
    log = open(log_path, "wb")  # noqa: SIM115 - the server writes to it until it ends
    proc = subprocess.Popen(cmd, cwd=args.cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, port


def wait_healthy(proc: subprocess.Popen, base: str, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    return False


class _Secret(http.server.BaseHTTPRequestHandler):
    """A local service the cors-proxy must not hand to a foreign page."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b"local secret\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


# -- the hostile mix ----------------------------------------------------------------------------


def _deep(n: int) -> str:
    return "[" * n + "]" * n


def _ref_chain(n: int) -> dict:
    defs: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n - 1)}
    defs[f"d{n - 1}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def hostile_cases(secret_url: str, save_dir: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(class, method, path, httpx kwargs) for one round; built once, bodies reused."""
    gbnf_chain = (
        "root ::= r0\n"
        + "".join(f'r{i} ::= "x" r{i + 1}\n' for i in range(4999))
        + 'r4999 ::= "x"\n'
    )
    lark_chain = (
        "start: r0\n" + "".join(f'r{i}: "x" r{i + 1}\n' for i in range(4999)) + 'r4999: "x"\n'
    )
    schema = _ref_chain(2000)
    deep = _deep(100_000)
    os.makedirs(os.path.join(save_dir, "adir"), exist_ok=True)

    def completion(**extra: Any) -> dict[str, Any]:
        return {"json": {"prompt": "Hi", "n_predict": 8, **extra}}

    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    cases: list[tuple[str, str, str, dict[str, Any]]] = [
        ("gbnf_chain_5000", "POST", "/completion", completion(grammar=gbnf_chain)),
        ("lark_chain_5000", "POST", "/completion", completion(grammar=lark_chain)),
        ("schema_ref_2000_completion", "POST", "/completion", completion(json_schema=schema)),
        (
            "schema_ref_2000_chat",
            "POST",
            "/v1/chat/completions",
            {
                "json": {
                    **chat,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "x", "schema": schema},
                    },
                }
            },
        ),
        (
            "schema_ref_2000_responses",
            "POST",
            "/v1/responses",
            {
                "json": {
                    "input": "Hi",
                    "max_output_tokens": 16,
                    "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
                }
            },
        ),
        ("gbnf_repeat_1e6", "POST", "/completion", completion(grammar='root ::= "x"{1000000}')),
        (
            "gbnf_literal_1MB",
            "POST",
            "/completion",
            completion(grammar='root ::= "' + "x" * 1_000_000 + '"'),
        ),
        ("huge_min_keep", "POST", "/completion", completion(min_keep=HUGE)),
        ("huge_seed", "POST", "/completion", completion(seed=HUGE)),
        ("huge_top_k", "POST", "/completion", completion(top_k=HUGE)),
        ("huge_n_probs", "POST", "/completion", completion(n_probs=HUGE)),
        ("huge_token_id", "POST", "/completion", {"json": {"prompt": [HUGE], "n_predict": 8}}),
        ("huge_logit_bias", "POST", "/completion", completion(logit_bias=[[HUGE, 1.0]])),
        ("huge_detokenize", "POST", "/detokenize", {"json": {"tokens": [HUGE]}}),
        ("huge_slot_id", "POST", f"/slots/{HUGE}?action=save", {"json": {"filename": "a.bin"}}),
        (
            "slots_deep_body",
            "POST",
            "/slots/0?action=save",
            {"content": deep.encode(), "headers": {"content-type": "application/json"}},
        ),
        (
            "slots_deep_filename",
            "POST",
            "/slots/0?action=restore",
            {
                "content": ('{"filename": ' + deep + "}").encode(),
                "headers": {"content-type": "application/json"},
            },
        ),
        ("slot_save_255", "POST", "/slots/0?action=save", {"json": {"filename": "a" * 255}}),
        ("slot_restore_255", "POST", "/slots/0?action=restore", {"json": {"filename": "a" * 255}}),
        ("slot_save_300", "POST", "/slots/0?action=save", {"json": {"filename": "a" * 300}}),
        ("slot_restore_300", "POST", "/slots/1?action=restore", {"json": {"filename": "a" * 300}}),
        ("slot_save_dotdot", "POST", "/slots/0?action=save", {"json": {"filename": ".."}}),
        ("slot_restore_dotdot", "POST", "/slots/0?action=restore", {"json": {"filename": "../x"}}),
        ("slot_save_dir", "POST", "/slots/1?action=save", {"json": {"filename": "adir"}}),
        ("slot_restore_dir", "POST", "/slots/1?action=restore", {"json": {"filename": "adir"}}),
        ("slot_save_nul", "POST", "/slots/0?action=save", {"json": {"filename": "a\x00b"}}),
        ("slot_save_number", "POST", "/slots/0?action=save", {"json": {"filename": 123}}),
        ("cors_octal_host", "GET", "/cors-proxy", {"params": {"url": "http://0177.0.0.1/"}}),
        ("cors_port_99999", "GET", "/cors-proxy", {"params": {"url": "http://127.0.0.1:99999/"}}),
        ("cors_crlf", "GET", "/cors-proxy", {"params": {"url": secret_url + "\r\nX-Injected: 1"}}),
        ("cors_idna", "GET", "/cors-proxy", {"params": {"url": "http://⒈.example/"}}),
        (
            "cors_evil_origin",
            "GET",
            "/cors-proxy",
            {"params": {"url": secret_url}, "headers": {"Origin": "http://evil.example"}},
        ),
        ("cors_own_page", "GET", "/cors-proxy", {"params": {"url": secret_url}}),
        (
            "malformed_json",
            "POST",
            "/completion",
            {
                "content": b'{"prompt": "Hi", "n_predict": ',
                "headers": {"content-type": "application/json"},
            },
        ),
        (
            "malformed_utf8",
            "POST",
            "/v1/chat/completions",
            {
                "content": b'{"messages": "\xff\xfe"}',
                "headers": {"content-type": "application/json"},
            },
        ),
        (
            "json_surrogate",
            "POST",
            "/completion",
            {
                "content": b'{"prompt": "\\ud800", "n_predict": 8}',
                "headers": {"content-type": "application/json"},
            },
        ),
        (
            "json_1e999",
            "POST",
            "/completion",
            {
                "content": b'{"prompt": "Hi", "n_predict": 8, "temperature": 1e999}',
                "headers": {"content-type": "application/json"},
            },
        ),
        (
            "deep_completion",
            "POST",
            "/completion",
            {
                "content": ('{"prompt": ' + deep + ', "n_predict": 8}').encode(),
                "headers": {"content-type": "application/json"},
            },
        ),
        (
            "deep_chat",
            "POST",
            "/v1/chat/completions",
            {
                "content": (
                    '{"messages": [{"role": "user", "content": "Hi", "x": '
                    + deep
                    + '}], "max_tokens": 8}'
                ).encode(),
                "headers": {"content-type": "application/json"},
            },
        ),
        (
            "deep_tokenize",
            "POST",
            "/tokenize",
            {
                "content": ('{"content": ' + deep + "}").encode(),
                "headers": {"content-type": "application/json"},
            },
        ),
        (
            "prompt_over_ctx",
            "POST",
            "/completion",
            {"json": {"prompt": "hello " * 6000, "n_predict": 8}},
        ),
        (
            "chat_over_ctx",
            "POST",
            "/v1/chat/completions",
            {"json": {"messages": [{"role": "user", "content": "hello " * 6000}], "max_tokens": 8}},
        ),
    ]
    return cases


def normal_request(rec: Recorder, client: httpx.Client, i: int) -> str:
    if i % 2:
        return rec.send(
            client,
            NORMAL,
            "POST",
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8},
        )
    return rec.send(
        client, NORMAL, "POST", "/completion", json={"prompt": "Once upon a time", "n_predict": 8}
    )


# -- the run ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {
        "cwd": args.cwd,
        "rounds_done": 0,
        "alive": True,
        "exit_code": None,
        "memory": {},
    }
    env = {**os.environ, "PYTHONPATH": args.cwd}
    report["engine_file"] = engine_file(args.cwd, env)
    print(f"engine imported from: {report['engine_file']}", flush=True)
    secret = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Secret)
    threading.Thread(target=secret.serve_forever, daemon=True).start()
    secret_url = f"http://127.0.0.1:{secret.server_address[1]}/secret"
    tmp = tempfile.mkdtemp(prefix="hostile-run-")
    save_dir = os.path.join(tmp, "slots")
    os.makedirs(save_dir)
    log_path = os.path.join(tmp, "server.log")
    report["server_log"] = log_path
    proc, port = start_server(args, save_dir, log_path)
    base = f"http://127.0.0.1:{port}"
    rec = Recorder()
    stop = threading.Event()
    try:
        if not wait_healthy(proc, base, args.startup_timeout):
            report["alive"] = proc.poll() is None
            report["exit_code"] = proc.poll()
            report["error"] = "the server did not become healthy"
            return report
        # a first completion compiles and warms up; start-up memory is measured after it
        with httpx.Client(base_url=base, timeout=args.timeout) as c:
            normal_request(rec, c, 0)
        report["memory"]["after_start"] = memory_kib(proc.pid)
        cases = [c for c in hostile_cases(secret_url, save_dir) if c[0] not in args.skip]

        def normals() -> None:
            with httpx.Client(base_url=base, timeout=args.timeout) as c:
                i = 1
                while not stop.is_set() and proc.poll() is None:
                    normal_request(rec, c, i)
                    i += 1
                    stop.wait(args.normal_pause)

        normal_thread = threading.Thread(target=normals, daemon=True)
        normal_thread.start()
        deadline = time.monotonic() + args.max_seconds
        with httpx.Client(base_url=base, timeout=args.timeout) as c:
            for r in range(1, args.rounds + 1):
                t0 = time.monotonic()
                for name, method, path, kw in cases:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        break
                    if rec.send(c, name, method, path, **kw) == "conn":
                        try:  # a dead server drops the connection just before it is reaped
                            proc.wait(2)
                        except subprocess.TimeoutExpired:
                            pass
                    if proc.poll() is not None:
                        report["killed_by"] = name
                alive = proc.poll() is None
                print(
                    f"round {r}: {time.monotonic() - t0:.1f} s, server {'alive' if alive else 'DEAD'}, "
                    f"RSS {memory_kib(proc.pid).get('VmRSS', 0) / 1024:.0f} MiB",
                    flush=True,
                )
                if not alive:
                    report["alive"], report["exit_code"] = False, proc.returncode
                    report["died_in_round"] = r
                    break
                report["rounds_done"] = r
                if r == 1:
                    report["memory"]["after_round_1"] = memory_kib(proc.pid)
                if time.monotonic() > deadline:
                    report["stopped_by_time_limit"] = True
                    break
        stop.set()
        normal_thread.join(args.timeout + 5)
        if proc.poll() is None:
            with httpx.Client(base_url=base, timeout=args.timeout) as c:
                normal_request(rec, c, 0)  # one last: still answering after everything
            report["memory"]["at_end"] = memory_kib(proc.pid)
        else:
            report["alive"], report["exit_code"] = False, proc.returncode
    finally:
        stop.set()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        secret.shutdown()
        report["classes"] = {k: {**vars(v), "codes": dict(v.codes)} for k, v in rec.stats.items()}
    if not report["alive"]:
        report["server_log_tail"] = Path(log_path).read_text(errors="replace")[-3000:]
    return report


def print_summary(report: dict[str, Any]) -> None:
    print(f"\nengine: {report['engine_file']}")
    print(
        f"rounds done: {report['rounds_done']}, server alive: {report['alive']}"
        + (
            f", exit code {report['exit_code']} (died in round {report.get('died_in_round')}, "
            f"killed by {report.get('killed_by')})"
            if not report["alive"]
            else ""
        )
    )
    if report.get("skipped"):
        print(f"skipped: {', '.join(report['skipped'])}")
    cols = ("n", "ok", "c4xx", "c5xx", "timeout", "conn")
    print(
        f"{'class':30} {'n':>4} {'2xx':>4} {'4xx':>4} {'5xx':>4} {'t/o':>4} {'conn':>4} {'max s':>7}  codes"
    )
    for name, st in sorted(report["classes"].items(), key=lambda kv: (kv[0] != NORMAL, kv[0])):
        codes = " ".join(f"{k}x{v}" for k, v in sorted(st["codes"].items()))
        print(
            f"{name:30} " + " ".join(f"{st[c]:>4}" for c in cols) + f" {st['max_s']:>7.2f}  {codes}"
        )
    bad = {k: v["first_5xx"] for k, v in report["classes"].items() if v["first_5xx"]}
    for name, body in sorted(bad.items()):
        print(f"  5xx {name}: {body[:150]!r}")
    print("memory (MiB):      VmRSS   VmHWM")
    for when in ("after_start", "after_round_1", "at_end"):
        m = report["memory"].get(when)
        if m:
            print(f"  {when:15} {m.get('VmRSS', 0) / 1024:7.0f} {m.get('VmHWM', 0) / 1024:7.0f}")
    if report.get("server_log_tail"):
        print("server log tail:\n" + report["server_log_tail"][-1500:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--cwd",
        default=str(Path(__file__).resolve().parent.parent),
        help="tree whose engine to run (cwd and PYTHONPATH of the server; default: this repository)",
    )
    p.add_argument("-m", "--model", default=str(DEFAULT_MODEL))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-seconds", type=float, default=300.0, help="time limit for the rounds")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout in seconds")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--ctx", type=int, default=1024, help="server -c (shared by the 2 slots)")
    p.add_argument("--threads", type=int, default=1, help="server -t")
    p.add_argument(
        "--normal-pause", type=float, default=0.5, help="seconds between the normal completions"
    )
    p.add_argument(
        "--skip",
        default="",
        help="comma-separated request classes not to send (e.g. ones "
        "that kill an old server, to see what the rest get)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    args = p.parse_args(argv)
    args.cwd = str(Path(args.cwd).resolve())
    args.skip = {name for name in args.skip.split(",") if name}
    report_skip = sorted(args.skip)
    report = run(args)
    report["skipped"] = report_skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if "error" in report:
        print(report["error"], f"(log: {report['server_log']})")
        print(Path(report["server_log"]).read_text(errors="replace")[-2000:])
        return 2
    print_summary(report)
    failed = not report["alive"] or any(v["c5xx"] or v["conn"] for v in report["classes"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
