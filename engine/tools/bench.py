"""Prompt-processing (ppN) and generation (tgN) throughput, measured like llama-bench.

With a depth d (llama-bench -d), d random tokens are processed first, untimed, and each
repetition measures its pp/tg on top of them ("tg64 @ d4096"). llama-bench restores a saved
state of the depth prefill before each repetition; truncating the sequence back to d
positions leaves the cache in the same state without the copy.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..batch import Batch


class TimedSamples:
    """Mean and spread of a result's samples_ts (tokens/s per repetition), as llama-bench prints them."""

    samples_ts: list[float]

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_ts) > 1 else 0.0


@dataclass(frozen=True)
class BenchResult(TimedSamples):
    test: str  # "pp512" / "tg128" / "tg128 @ d4096"
    n_prompt: int
    n_gen: int
    n_depth: int
    n_threads: int
    n_batch: int
    n_ubatch: int
    samples_ts: list[float]

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(avg_ts=self.avg_ts, stddev_ts=self.stddev_ts)
        return d


def _tokens(n: int, n_vocab: int, rng) -> np.ndarray:
    return rng.integers(0, n_vocab, n, dtype=np.int32)


def _keep(ctx, n_past: int) -> None:
    """Sequence 0 back to its first n_past positions (the depth prefill)."""
    if n_past:
        ctx.kv.seq_rm(0, n_past)
    else:
        ctx.kv.seq_clear(0)


def run_prompt(ctx, n_prompt: int, rng, n_past: int = 0) -> None:
    """Process n_prompt tokens after the first n_past positions, in n_batch-sized decode
    calls, logits for the last only."""
    _keep(ctx, n_past)
    toks = _tokens(n_prompt, ctx.cfg.n_vocab, rng)
    for i0 in range(0, n_prompt, ctx.n_batch):
        part = toks[i0 : i0 + ctx.n_batch]
        ctx.decode(Batch.for_sequence(part, n_past + i0, logits_last=i0 + len(part) == n_prompt))


def run_gen(ctx, n_gen: int, rng, n_past: int = 0) -> None:
    """Generate n_gen tokens greedily, one decode call each, after the first n_past positions."""
    _keep(ctx, n_past)
    tok = int(_tokens(1, ctx.cfg.n_vocab, rng)[0])
    for i in range(n_gen):
        logits = ctx.decode(Batch.for_sequence([tok], n_past + i))
        tok = int(np.argmax(logits[0]))


def bench(
    ctx, n_prompt: int, n_gen: int, reps: int, n_threads: int, seed: int = 1234, n_depth: int = 0
) -> BenchResult:
    """One llama-bench test: ppN (n_gen 0) or tgN (n_prompt 0), reps timed runs after a
    warm-up, each on top of n_depth untimed positions (needs n_ctx >= n_depth + n)."""
    rng = np.random.default_rng(seed)
    fn, n = (run_prompt, n_prompt) if n_prompt else (run_gen, n_gen)
    if n_depth:
        run_prompt(ctx, n_depth, rng)
    fn(ctx, min(n, 16) if fn is run_gen else n, rng, n_depth)  # warm-up, as llama-bench does
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(ctx, n, rng, n_depth)
        samples.append(n / (time.perf_counter() - t0))
    test = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
    if n_depth:
        test += f" @ d{n_depth}"
    return BenchResult(
        test, n_prompt, n_gen, n_depth, n_threads, ctx.n_batch, ctx.n_ubatch, samples
    )
