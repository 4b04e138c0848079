"""app/bench_gui.py on a tiny generated llama: the one JSON line `ggstation bench --path gui`
parses, with every field it reads (figures not checked: they are this machine's, now)."""

from __future__ import annotations

import json

import pytest

from app import bench_gui


def test_bench_gui_prints_one_json_line_with_the_fields(tiny_llama_path, capsys, qapp):
    # enough tokens for several painted frames (~30 a second) even when this tiny model decodes
    # them in a fraction of a millisecond each: 96 once fitted in one frame (a failed run)
    n_gen, reps = 480, 2
    assert (
        bench_gui.main(
            [
                "-m",
                str(tiny_llama_path),
                "-p",
                "8",
                "-n",
                str(n_gen),
                "-r",
                str(reps),
                "-t",
                "1",
                "--json",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    r = json.loads(lines[0])
    assert r["path"] == "gui" and r["model"] == str(tiny_llama_path.resolve())
    assert r["n_gen"] == n_gen and r["threads"] == 1 and r["n_prompt"] >= 8
    assert len(r["samples_ts"]) == reps and all(s > 0 for s in r["samples_ts"])
    assert abs(r["avg_ts"] - sum(r["samples_ts"]) / reps) < 1e-6
    assert 0 <= r["event_loop_p50_ms"] <= r["event_loop_p95_ms"] <= r["event_loop_max_ms"]
    assert set(r["cpu_ms_per_token"]) == {"gui", "engine", "app_threads", "native"}


def test_bench_gui_refuses_a_missing_model(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench_gui.main(["-m", str(tmp_path / "none.gguf"), "--json"])
    assert e.value.code == 2 and "no such model file" in capsys.readouterr().err


def test_a_reply_is_timed_between_frames_not_to_the_end_flush():
    # frames show what the engine handed over up to a wake-up interval late, at both ends; the
    # end's flush comes at once and would count the first frame's lag as speed
    rep = bench_gui.RepResult(
        arrivals=[(1.0, 10), (1.2, 60), (1.4, 110), (1.41, 128)], n_streamed=3
    )
    assert rep.tokens_per_s() == pytest.approx(100 / 0.4)
    short = bench_gui.RepResult(
        arrivals=[(1.0, 10), (1.3, 64)], n_streamed=1
    )  # one frame: the flush ends it
    assert short.tokens_per_s() == pytest.approx(54 / 0.3)
    with pytest.raises(RuntimeError, match="too few UI updates"):
        bench_gui.RepResult(arrivals=[(1.0, 64)], n_streamed=0).tokens_per_s()
