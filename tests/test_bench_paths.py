"""`ggstation bench --path engine,http,gui`: argument parsing, the rows each path adds, and the
tokens/s arithmetic (no timing assertions: the numbers only have to be there and positive)."""

from __future__ import annotations

import io
import json
import sys

import pytest

from engine.cli import main
from engine.commands import bench as bench_cmd
from engine.errors import EngineError
from engine.tools import bench_paths
from engine.tools.bench_paths import PathResult, StreamTiming, aggregate_ts, parse_paths


def test_parse_paths_keeps_order_and_refuses_unknown_names():
    assert parse_paths("http,engine,http") == ["http", "engine"]
    with pytest.raises(ValueError, match="unknown path tui"):
        parse_paths("engine,tui")


def test_bench_refuses_a_bad_path_and_zero_clients(tiny_llama_path, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "-m", str(tiny_llama_path), "--path", "browser"])
    assert "unknown path browser" in capsys.readouterr().err
    assert main(["bench", "-m", str(tiny_llama_path), "--path", "http", "--clients", "0"]) == 1
    assert "--clients must be at least 1" in capsys.readouterr().err


def test_stream_rates_exclude_the_first_token():
    # tokens at 1.0, 1.1, 1.2, 1.3: three intervals of 0.1 s after the first token
    a = StreamTiming([1.0, 1.1, 1.2, 1.3])
    assert a.decode_ts() == pytest.approx(10.0) and aggregate_ts([a]) == pytest.approx(10.0)
    assert StreamTiming([2.0]).decode_ts() == 0.0 and aggregate_ts([]) == 0.0


def test_aggregate_counts_the_span_all_clients_stream():
    a = StreamTiming([1.0, 1.1, 1.2, 1.3, 1.4])
    b = StreamTiming([1.15, 1.25, 1.35, 1.45, 1.55])  # starts late (its prompt), ends late
    # both stream from 1.15 (b's first) to 1.4 (a's last): a's 1.2, 1.3, 1.4 and b's 1.25, 1.35
    assert aggregate_ts([a, b]) == pytest.approx(5 / 0.25)
    c = StreamTiming([2.0, 2.5])  # no overlap with a: every token after each first, whole span
    assert aggregate_ts([a, c]) == pytest.approx(5 / 1.5)


def test_a_stream_read_in_one_piece_is_timed_from_its_request():
    # a client not scheduled while the server streamed reads every token at once: the only
    # span it saw runs from sending the request (1.5) to that read (2.0), a lower bound
    one_read = StreamTiming([2.0] * 6, t_sent=1.5)
    assert one_read.decode_ts() == pytest.approx(5 / 0.5)
    assert aggregate_ts([one_read]) == pytest.approx(5 / 0.5)
    assert aggregate_ts([one_read, StreamTiming([2.2] * 6, t_sent=1.7)]) == pytest.approx(10 / 0.7)
    assert StreamTiming([2.0] * 6).decode_ts() == 0.0  # no request time: nothing observed


def _chunked(*payloads: bytes) -> bytes:
    return b"".join(b"%x;ext=1\r\n" % len(p) + p + b"\r\n" for p in payloads) + b"0\r\n\r\n"


def test_chunked_events_come_whole_however_the_bytes_are_cut():
    # an event split over two chunks, two events in one chunk, a chunk extension, the end chunk
    body = _chunked(
        b'data: {"stop":false,"n":1}\n\ndata: {"st',
        b'op":false,"n":2}\n\n',
        b'data: {"stop":true}\n\n',
    )
    for step in (1, 3, 7, len(body)):
        reader = bench_paths._ChunkedEvents()
        events = [ev for i in range(0, len(body), step) for ev in reader.feed(body[i : i + step])]
        assert events == [
            b'data: {"stop":false,"n":1}',
            b'data: {"stop":false,"n":2}',
            b'data: {"stop":true}',
        ]
        assert reader.ended
    reader = bench_paths._ChunkedEvents()
    assert (
        reader.feed(b'1a\r\ndata: {"stop":false}\n\n') == [] and not reader.ended
    )  # chunk not whole yet


def test_http_path_rows_next_to_the_engine_row(tiny_llama_path, capsys):
    argv = [
        "bench",
        "-m",
        str(tiny_llama_path),
        "-p",
        "0",
        "-n",
        "6",
        "-r",
        "2",
        "-t",
        "1",
        "--path",
        "engine,http",
        "--clients",
        "1,2",
        "-o",
        "json",
    ]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["tg6", "tg6 (http)", "tg6 (http, 2 clients)"]
    for r in rows[1:]:
        assert r["path"] == "http" and r["n_gen"] == 6 and len(r["samples_ts"]) == 2
        assert r["avg_ts"] > 0 and len(r["per_client_ts"]) == 2 and r["avg_per_client_ts"] > 0
        assert r["model_type"] == rows[0]["model_type"]
    assert [r["n_clients"] for r in rows[1:]] == [1, 2]


@pytest.mark.parametrize(
    "flag, backend",
    [([], "CPU (numba)"), (["--int8"], "CPU (numba, int8)"), (["--no-int8"], "CPU (numba, float)")],
)
def test_bench_rows_name_the_decode_path(tiny_llama_path, capsys, flag, backend):
    argv = [
        "bench",
        "-m",
        str(tiny_llama_path),
        "-p",
        "0",
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "1",
        "-o",
        "jsonl",
        *flag,
    ]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["backends"] == backend


def test_http_path_markdown_row(tiny_llama_path, capsys):
    assert (
        main(
            ["bench", "-m", str(tiny_llama_path), "-n", "4", "-r", "1", "-t", "1", "--path", "http"]
        )
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| model |") and len(lines) == 3
    assert "| tg4 (http) |" in lines[2]


def _fake_gui(tmp_path, body: str) -> list[str]:
    script = tmp_path / "fake_gui.py"
    script.write_text(body)
    return [sys.executable, str(script)]


def test_gui_path_reads_the_json_line(tmp_path):
    line = {
        "path": "gui",
        "samples_ts": [40.0, 44.0],
        "avg_ts": 42.0,
        "event_loop_p95_ms": 12.5,
        "n_gen": 16,
    }
    cmd = _fake_gui(tmp_path, f"print('loading...')\nprint({json.dumps(json.dumps(line))})\n")
    r = bench_paths.bench_gui(cmd, 16, 1)
    assert isinstance(r, PathResult) and r.test == "tg16 (gui)"
    assert r.avg_ts == pytest.approx(42.0) and r.as_dict()["event_loop_p95_ms"] == 12.5


@pytest.mark.parametrize(
    "body, message",
    [
        (
            "import sys\nsys.exit('Qt could not start')\n",
            "the gui benchmark failed: Qt could not start",
        ),
        ("print('no json here')\n", "printed no JSON result"),
        ('print(\'{"path": "gui"}\')\n', "has no samples_ts"),
    ],
)
def test_gui_path_failures_are_one_clear_line(tmp_path, body, message):
    with pytest.raises(EngineError, match=message):
        bench_paths.bench_gui(_fake_gui(tmp_path, body), 4, 1)


def test_gui_path_without_the_module_says_so(tiny_llama_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_cmd, "GUI_MODULE", "app.no_such_bench_module")
    argv = [
        "bench",
        "-m",
        str(tiny_llama_path),
        "-p",
        "0",
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "1",
        "--path",
        "engine,gui",
    ]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert "| tg4 |" in out  # the engine row is still printed
    assert (
        "error: gui path: the gui path needs the desktop app's benchmark (app.no_such_bench_module)"
        in err
    )
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "path, flag, env", [("x16", None, "-"), ("int8", "--int8", "1-"), ("float", "--no-int8", "-1")]
)
def test_child_processes_run_the_benchs_decode_path(tmp_path, monkeypatch, path, flag, env):
    """The serve child and the gui child decode on the path the bench was asked for, whatever
    the shell's GGSTATION_INT8 / GGSTATION_NO_INT8 say."""
    monkeypatch.setenv("GGSTATION_NO_INT8", "1")
    monkeypatch.setenv("GGSTATION_INT8", "1")
    started = []
    with monkeypatch.context() as m:
        m.setattr(
            bench_paths.subprocess,
            "Popen",
            lambda cmd, **kw: started.append((cmd, kw["env"])) or _NoProcess(),
        )
        bench_paths.ServeProcess("m.gguf", 1, 1, 128, decode_path=path)
    cmd, child_env = started[0]
    assert [a for a in cmd if a in ("--int8", "--no-int8")] == ([flag] if flag else [])
    assert child_env.get("GGSTATION_INT8", "") + "-" + child_env.get("GGSTATION_NO_INT8", "") == env
    body = (
        "import os, sys\n"
        "e = os.environ.get\n"
        "sys.exit('INT8=' + e('GGSTATION_INT8', '') + '-' + e('GGSTATION_NO_INT8', ''))\n"
    )
    with pytest.raises(EngineError, match=f"INT8={env}"):
        bench_paths.bench_gui(_fake_gui(tmp_path, body), 4, 1, decode_path=path)


class _NoProcess:
    def __init__(self):
        self.stdin, self.stdout, self.stderr = io.StringIO(), io.StringIO(), io.StringIO()
