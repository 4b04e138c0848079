"""The memory check a context makes before it allocates, and one clear line for absurd runtime
values, through the engine API and every command (tiny generated model; the machine's
available memory is faked where the verdict matters)."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from engine import memory
from engine.cli import main
from engine.context import Context, ContextParams
from engine.errors import EngineError, InsufficientMemoryError
from engine.memory import MemoryFit
from engine.model import load_model

MiB = 1 << 20
SMALL_RAM = 64 * MiB  # the tiny model needs ~512 bytes a position (KV cache, score buffer)
TOO_BIG = str(1 << 20)  # positions: ~512 MiB


@pytest.fixture
def small_machine(monkeypatch):
    """64 MiB of RAM available and no swap, whatever the test machine has."""
    monkeypatch.setattr(memory, "available_memory", lambda: (SMALL_RAM, 0))
    monkeypatch.delenv(memory.NO_MEM_CHECK_ENV, raising=False)


@pytest.fixture(scope="module")
def model(tiny_llama_path):
    m = load_model(tiny_llama_path, n_threads=1)
    yield m
    m.close()


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_memory_fit_verdicts():
    assert MemoryFit(50, 100, 0).verdict == "fits"
    assert MemoryFit(90, 100, 0).verdict == "tight"  # over 80 % of RAM
    assert MemoryFit(105, 100, 0).verdict == "tight"  # over RAM but within the 10 % margin
    assert MemoryFit(150, 100, 0).verdict == "too big"
    assert MemoryFit(150, 100, 100).verdict == "tight"  # swap counts for the refusal only
    assert (
        "needs 150 B, 100 B available (+ 100 B free swap): tight"
        == MemoryFit(150, 100, 100).summary()
    )


def test_context_refuses_what_cannot_fit_and_says_what_would(model, small_machine):
    with pytest.raises(InsufficientMemoryError) as exc:
        Context(model, ContextParams(n_ctx=1 << 20))
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(
        "not enough memory for n_ctx 1048576 with 1 sequence(s)"
    )
    assert "64.0 MiB of RAM and 0 B of swap are free" in msg and "GGSTATION_NO_MEM_CHECK=1" in msg
    assert exc.value.needed_bytes > 2 * SMALL_RAM and exc.value.available_bytes == SMALL_RAM
    suggested = int(msg.split("lower the context size (-c ")[1].split()[0])
    assert 256 <= suggested < 1 << 18
    Context(model, ContextParams(n_ctx=suggested))  # the advice holds


def test_context_memory_check_can_be_turned_off(model, small_machine, monkeypatch):
    Context(model, ContextParams(n_ctx=1 << 18, check_memory=False))
    monkeypatch.setenv(memory.NO_MEM_CHECK_ENV, "1")
    Context(model, ContextParams(n_ctx=1 << 18))


def test_context_warns_when_close_and_beyond_training_context(model, small_machine, caplog):
    with caplog.at_level(logging.WARNING, logger="ggstation.engine"):
        Context(model, ContextParams(n_ctx=236_000))  # ~58 MiB of 64: tight; train context is 256
    text = caplog.text
    assert "n_ctx_seq (236000) > n_ctx_train (256) -- possible training context overflow" in text
    assert "expect swapping" in text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ggstation.engine"):
        Context(model, ContextParams(n_ctx=256))
    assert caplog.text == ""


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(n_ctx=-1), "invalid context size -1"),
        (dict(n_ctx=10**12), "invalid context size 1000000000000"),
        (dict(n_seq_max=0), "invalid number of sequences 0"),
        (dict(n_seq_max=100_000), "invalid number of sequences 100000 (-np): must be 1..256"),
        (dict(n_batch=0), "n_batch and n_ubatch must be >= 1"),
        (dict(n_ubatch=0), "n_batch and n_ubatch must be >= 1"),
        (dict(n_ctx=8, n_seq_max=16), "a context of 8 positions cannot be split over 16 sequences"),
        (dict(type_k="q9"), "unsupported KV cache type 'q9'"),
    ],
)
def test_absurd_context_params_are_one_clear_error(model, kw, needle):
    with pytest.raises(EngineError) as exc:
        Context(model, ContextParams(**kw))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_allocation_failure_is_an_engine_error(model, monkeypatch):
    def refuse(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr("engine.context.KVCache", refuse)
    with pytest.raises(
        InsufficientMemoryError, match="cannot allocate .* for the KV cache and compute buffers"
    ):
        Context(model, ContextParams(n_ctx=64, check_memory=False))


# -- commands ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "-p", "hi", "-n", "1", "-c", TOO_BIG],
        ["chat", "-c", TOO_BIG],
        ["bench", "-p", TOO_BIG, "-n", "0", "-r", "1", "-t", "1"],
        ["perplexity", "-f", "{text}", "-c", TOO_BIG],
        ["serve", "--port", "0", "-c", TOO_BIG, "-np", "1"],
    ],
)
def test_commands_refuse_a_context_that_cannot_fit(
    tiny_llama_path, tmp_path, small_machine, capsys, monkeypatch, argv
):
    text = tmp_path / "t.txt"
    text.write_text("the wind " * 50)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello"))
    argv = [a.format(text=text) for a in argv]
    assert main([argv[0], "-m", str(tiny_llama_path), *argv[1:]]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "not enough memory" in line and "lower the context size (-c " in line


def test_generate_no_mem_check_flag(tiny_llama_path, small_machine, capsys):
    assert (
        main(
            [
                "generate",
                "-m",
                str(tiny_llama_path),
                "-p",
                "hi",
                "-n",
                "1",
                "-c",
                str(1 << 18),
                "--no-mem-check",
                "--temp",
                "0",
            ]
        )
        == 0
    )
    assert "error" not in capsys.readouterr().err


def test_info_shows_the_fit(tiny_llama_path, small_machine, capsys):
    assert main(["info", "-m", str(tiny_llama_path), "-c", TOO_BIG]) == 0
    out = capsys.readouterr().out
    assert "memory available       64.0 MiB RAM + 0 B free swap" in out
    assert "fit                    too big" in out and "(beyond the training context 256)" in out
    assert main(["info", "-m", str(tiny_llama_path), "-c", "64"]) == 0
    assert "fit                    fits" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["generate", "-p", "hi", "-np", "100000"], "invalid number of sequences 100000"),
        (["generate", "-p", "hi", "-t", "0"], "invalid -t/--threads 0"),
        (["generate", "-p", "hi", "-t", "-5"], "invalid -t/--threads -5"),
        (["bench", "-t", "0", "-p", "8", "-n", "0"], "invalid -t/--threads 0"),
        (
            ["bench", "-b", "0", "-p", "8", "-n", "0", "-t", "1"],
            "n_batch and n_ubatch must be >= 1",
        ),
        (
            ["perplexity", "-f", "{text}", "-c", "32", "-ub", "0"],
            "n_batch and n_ubatch must be >= 1",
        ),
        (["info", "-np", "0"], "invalid -np/--parallel 0"),
        (["info", "-np", "100000"], "invalid number of sequences 100000"),
        (["info", "-c", "-3"], "invalid context size -3"),
        (["info", "-c", str(10**12)], "invalid context size 1000000000000"),
    ],
)
def test_absurd_runtime_values_are_one_clear_line(tiny_llama_path, tmp_path, capsys, argv, needle):
    text = tmp_path / "t.txt"
    text.write_text("the wind " * 50)
    argv = [a.format(text=text) for a in argv]
    assert main([argv[0], "-m", str(tiny_llama_path), *argv[1:]]) == 1
    assert needle in one_error_line(capsys.readouterr().err)


def test_too_many_threads_is_a_warning_not_a_failure(tiny_llama_path, capsys):
    assert (
        main(
            [
                "generate",
                "-m",
                str(tiny_llama_path),
                "-p",
                "hi",
                "-n",
                "1",
                "-c",
                "64",
                "-t",
                "100000",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "warning: -t 100000 is more than the" in err and "Traceback" not in err


def test_router_keeps_a_failed_childs_message(tmp_path):
    from engine.router.supervisor import Router

    router = Router({"m": tmp_path / "m.gguf"})
    child = router.children["m"]
    router._on_message(child, b'{"event": "failed", "error": "not enough memory for n_ctx 9"}')
    assert child.error == "not enough memory for n_ctx 9"


def test_resident_bytes_counts_the_present_pages_of_the_given_mappings(tmp_path):
    """The pages of each mapping asked about that are in this process's page tables (Linux's
    /proc/self/pagemap): those touched, not those released or never read, nor another
    mapping's."""
    import mmap
    import sys

    import numpy as np

    from engine.memory import resident_bytes

    if not sys.platform.startswith("linux"):
        pytest.skip("resident bytes come from Linux's /proc/self/pagemap")
    page = mmap.PAGESIZE
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"\1" * (64 * page))
    b.write_bytes(b"\1" * (64 * page))
    ma = np.memmap(a, dtype=np.uint8, mode="r")
    mb = np.memmap(b, dtype=np.uint8, mode="r")
    assert resident_bytes([ma, mb]) == 0  # mapped, never read
    assert int(ma[::page].sum()) == 64  # every page of a
    assert resident_bytes([ma]) == 64 * page
    assert resident_bytes([mb]) == 0
    ma._mmap.madvise(mmap.MADV_DONTNEED, 0, 16 * page)  # as release_mapped_pages does
    assert resident_bytes([ma, mb]) == 48 * page
    assert int(mb[::page].sum()) == 64
    assert resident_bytes([ma, mb]) == 112 * page
    assert resident_bytes([]) == 0


def test_resident_bytes_agree_with_smaps_rss(tmp_path):
    """What pagemap says is present is what smaps reports as the mapping's Rss."""
    import mmap
    import sys

    import numpy as np

    from engine.memory import resident_bytes

    if not sys.platform.startswith("linux"):
        pytest.skip("Linux's /proc/self/smaps and pagemap")
    page = mmap.PAGESIZE
    path = tmp_path / "w.bin"
    path.write_bytes(bytes(range(256)) * (300 * page // 256))
    m = np.memmap(path, dtype=np.uint8, mode="r")
    assert (
        int(m[: 100 * page : page].sum()) + int(m[250 * page :: 3 * page].sum()) >= 0
    )  # touch some pages

    with open("/proc/self/smaps") as fh:
        lines = fh.read().splitlines()
    header = next(i for i, line in enumerate(lines) if line.endswith(" " + str(path)))
    rss_kb = next(int(line.split()[1]) for line in lines[header:] if line.startswith("Rss:"))
    assert resident_bytes([m]) == rss_kb * 1024 > 0
