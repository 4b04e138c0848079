"""Mutated tiny models through the public load path: each loads and generates, or raises an
EngineError (never another exception, never a hang).

The corpus is tests/hostile_gguf.py's `fuzz_case`: seeded mutations of runnable tiny llama,
gemma3 and phi3 models (metadata type swaps, NaN/inf, huge and negative numbers, cut and
retyped arrays, odd tensor shapes, types and offsets, bit flips, truncation). Each case goes
the way `ggstation info`, `generate` and `chat` go: inspect_model, load_model (config,
tensors, tokenizer), a Context, a tokenized prompt, two greedy tokens, the chat template.

The default run takes FAST_CASES cases; the `slow` run SLOW_CASES. `python
tests/test_gguf_fuzz.py [N]` runs N cases and prints a tally of the outcomes.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

import hostile_gguf
from engine.errors import EngineError

FAST_CASES = 200
SLOW_CASES = 2000
SEED = 0
CASE_TIMEOUT_S = 30  # a case takes ~20 ms; this only catches a hang


class CaseTimeout(BaseException):
    """Raised by the alarm: not an Exception, so nothing in the engine can swallow it."""


@contextmanager
def time_limit(seconds: float):
    def fire(signum, frame):
        raise CaseTimeout(f"no result after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def exercise(path: Path) -> str:
    """What `ggstation info`, `generate` and `chat` do with the file; returns 'info-error',
    'load-error' or 'ran'. EngineErrors raised after inspect_model accepted the file propagate."""
    from engine import Context, ContextParams, SamplingParams, inspect_model, load_model
    from engine.generate import generate
    from engine.tokenizer.chat_template import ChatTemplate, chat_prompt_tokens

    info = inspect_model(path)
    if info.error is not None:
        assert str(path) in info.error, info.error
        with pytest.raises(EngineError):  # what info refuses, loading refuses too
            load_model(path).close()
        return "info-error"
    info.estimate(n_ctx=4096, n_seq_max=1)
    model = load_model(path, n_threads=1)
    try:
        tok = model.tokenizer
        ctx = Context(model, ContextParams(n_ctx=64, n_batch=32, n_ubatch=32))
        template = ChatTemplate.from_gguf(model.gguf)
        prompt = chat_prompt_tokens(template, tok, [{"role": "user", "content": "hi there"}])
        prompt = prompt or tok.encode("hello world", add_special=True, parse_special=True) or [0]
        steps = list(generate(ctx, tok, prompt[:48], SamplingParams(temperature=0.0), n_predict=2))
        assert steps and steps[-1].finish_reason is not None
        tok.decode([s.token for s in steps])
    finally:
        model.close()
    return "ran"


def run_case(bases, i: int, tmp_path: Path) -> str:
    name, data = hostile_gguf.fuzz_case(bases, i, SEED)
    path = tmp_path / f"fuzz-{i}.gguf"
    path.write_bytes(data)
    try:
        with time_limit(CASE_TIMEOUT_S):
            try:
                return exercise(path)
            except EngineError as e:
                msg = str(e)
                assert msg and "\n" not in msg.strip(), f"{name}: not one line: {msg!r}"
                return "load-error"
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    return hostile_gguf.fuzz_bases(tmp_path_factory.mktemp("fuzz-bases"))


@pytest.mark.parametrize("i", range(FAST_CASES))
def test_fuzzed_model_loads_or_raises_engine_error(bases, tmp_path, i):
    run_case(bases, i, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("i", range(FAST_CASES, SLOW_CASES))
def test_fuzzed_model_loads_or_raises_engine_error_long(bases, tmp_path, i):
    run_case(bases, i, tmp_path)


COMMAND_CASES = 24  # the first cases through every command (most are refused, at every stage)
COMMANDS = {
    "info": [],
    "tokenize": ["-p", "hi"],
    "generate": ["-p", "hi", "-n", "2", "-c", "64", "--temp", "0"],
    "chat": ["-n", "2", "-c", "64"],
    "bench": ["-p", "8", "-n", "2", "-r", "1", "-t", "1"],
    "perplexity": ["-f", "{text}", "-c", "16", "--chunks", "1"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_fuzzed_models_through_every_command_give_one_line(
    bases, tmp_path, capsys, monkeypatch, command
):
    """What each `ggstation` command prints for a broken model: one `error:` line, no traceback."""
    import io

    from engine.cli import main

    text = tmp_path / "t.txt"
    text.write_text("the wind in the hall " * 20)
    outcomes = []
    for i in range(COMMAND_CASES):
        name, data = hostile_gguf.fuzz_case(bases, i, SEED)
        path = tmp_path / "m.gguf"
        path.write_bytes(data)
        monkeypatch.setattr(sys, "stdin", io.StringIO("hello"))
        with time_limit(CASE_TIMEOUT_S):
            rc = main([command, "-m", str(path), *(a.format(text=text) for a in COMMANDS[command])])
        err = capsys.readouterr().err
        assert "Traceback" not in err, f"{name}: {err}"
        errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert (rc, len(errors)) in ((0, 0), (1, 1)), f"{name}: rc {rc}, {err}"
        outcomes.append(rc)
    assert outcomes.count(1) >= COMMAND_CASES // 3 and outcomes.count(0) >= 1, outcomes


def test_fuzz_corpus_is_deterministic_and_mixed(bases):
    """Same seed, same bytes; and the corpus reaches past the header (most cases parse)."""
    a = [hostile_gguf.fuzz_case(bases, i, SEED) for i in range(30)]
    assert a == [hostile_gguf.fuzz_case(bases, i, SEED) for i in range(30)]
    ops = {name.split("-", 2)[2].split(":")[0] for name, _ in a}
    assert len(ops) > 8, ops


def main(n: int) -> int:
    """Run cases 0..n-1 and print the tally and every case that failed."""
    import tempfile
    import traceback
    from collections import Counter

    tmp = Path(tempfile.mkdtemp())
    bases = hostile_gguf.fuzz_bases(tmp / "bases")
    tally: Counter[str] = Counter()
    for i in range(n):
        try:
            tally[run_case(bases, i, tmp)] += 1
        except BaseException as e:  # noqa: BLE001 - a tally of everything that is not allowed
            if isinstance(e, KeyboardInterrupt):
                raise
            tally["FAILED"] += 1
            name = hostile_gguf.fuzz_case(bases, i, SEED)[0]
            last = traceback.extract_tb(e.__traceback__)[-1]
            print(
                f"FAILED {name}: {type(e).__name__}: {str(e)[:160]} "
                f"({Path(last.filename).name}:{last.lineno})",
                flush=True,
            )
    print(dict(tally))
    return 1 if tally["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else SLOW_CASES))
