"""`ggstation info`, `bench` and `perplexity` on a tiny generated model (fast)."""

from __future__ import annotations

import json
import math

import pytest

from engine.cli import main


def test_info_reports_model_and_estimate(tiny_llama_path, capsys):
    assert main(["info", "-m", str(tiny_llama_path), "-c", "128", "-np", "2"]) == 0
    out = capsys.readouterr().out
    for text in (
        "architecture           llama",
        "Q8_0",
        "context (train)",
        "KV cache",
        "from the GGUF",
    ):
        assert text.split()[0] in out
    assert main(["info", "-m", str(tiny_llama_path), "-c", "128", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["arch"] == "llama" and d["memory_estimate"]["kv_bytes"] > 0 and d["has_chat_template"]


def test_bench_json_has_llama_bench_fields(tiny_llama_path, capsys):
    assert (
        main(
            [
                "bench",
                "-m",
                str(tiny_llama_path),
                "-p",
                "32",
                "-n",
                "8",
                "-r",
                "2",
                "-t",
                "1",
                "-o",
                "json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["pp32", "tg8"]
    for r in rows:
        assert {"test", "n_prompt", "n_gen", "avg_ts", "stddev_ts"} <= r.keys()
        assert r["avg_ts"] > 0 and len(r["samples_ts"]) == 2


def test_bench_depth_measures_on_top_of_a_prefilled_context(tiny_llama_path, capsys):
    assert (
        main(
            [
                "bench",
                "-m",
                str(tiny_llama_path),
                "-p",
                "8",
                "-n",
                "4",
                "-d",
                "0,40",
                "-r",
                "1",
                "-t",
                "1",
                "-o",
                "json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["pp8", "pp8 @ d40", "tg4", "tg4 @ d40"]
    assert [r["n_depth"] for r in rows] == [0, 40, 0, 40]


def test_bench_depth_continues_after_the_depth_positions(tiny_llama_path):
    from engine.context import Context, ContextParams
    from engine.model import load_model
    from engine.tools.bench import bench

    ctx = Context(load_model(tiny_llama_path), ContextParams(n_ctx=64))
    bench(ctx, 0, 5, 1, 1, n_depth=40)
    assert ctx.kv.seq_len(0) == 45
    bench(ctx, 7, 0, 1, 1, n_depth=20)
    assert ctx.kv.seq_len(0) == 27


def test_perplexity_prints_final_estimate(tiny_llama_path, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the world is in the hall, and the wind is on the shore. " * 20)
    assert (
        main(
            ["perplexity", "-m", str(tiny_llama_path), "-f", str(text), "-c", "32", "--chunks", "3"]
        )
        == 0
    )
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out.startswith("Final estimate: PPL = ")
    ppl = float(out.split()[4])
    assert math.isfinite(ppl) and ppl > 1


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["info", "-m", "/nonexistent.gguf"], "no such"),
        (["perplexity", "-m", "{model}", "-f", "/nonexistent.txt", "-c", "32"], "cannot read"),
        (["perplexity", "-m", "{model}", "-f", "{short}", "-c", "64"], "need at least"),
    ],
)
def test_bad_input_is_a_clear_error(tiny_llama_path, tmp_path, capsys, argv, needle):
    short = tmp_path / "short.txt"
    short.write_text("hi")
    argv = [a.format(model=tiny_llama_path, short=short) for a in argv]
    assert main(argv) == 1
    assert needle in capsys.readouterr().err.lower()
