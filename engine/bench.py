"""Prompt-processing (ppN) and generation (tgN) throughput, measured like llama-bench."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from .batch import Batch


@dataclass(frozen=True)
class BenchResult:
    test: str  # "pp512" / "tg128"
    n_prompt: int
    n_gen: int
    n_threads: int
    n_batch: int
    n_ubatch: int
    samples_ts: list[float]

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_ts) > 1 else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(avg_ts=self.avg_ts, stddev_ts=self.stddev_ts)
        return d


def _tokens(n: int, n_vocab: int, rng) -> np.ndarray:
    return rng.integers(0, n_vocab, n, dtype=np.int32)


def run_prompt(ctx, n_prompt: int, rng) -> None:
    """Process n_prompt tokens in n_batch-sized decode calls, logits for the last only."""
    ctx.kv.seq_clear(0)
    toks = _tokens(n_prompt, ctx.cfg.n_vocab, rng)
    for i0 in range(0, n_prompt, ctx.n_batch):
        part = toks[i0 : i0 + ctx.n_batch]
        ctx.decode(Batch.for_sequence(part, i0, logits_last=i0 + len(part) == n_prompt))


def run_gen(ctx, n_gen: int, rng) -> None:
    ctx.kv.seq_clear(0)
    tok = int(_tokens(1, ctx.cfg.n_vocab, rng)[0])
    for i in range(n_gen):
        logits = ctx.decode(Batch.for_sequence([tok], i))
        tok = int(np.argmax(logits[0]))


def bench(ctx, n_prompt: int, n_gen: int, reps: int, n_threads: int, seed: int = 1234) -> BenchResult:
    rng = np.random.default_rng(seed)
    fn, n = (run_prompt, n_prompt) if n_prompt else (run_gen, n_gen)
    fn(ctx, min(n, 16) if fn is run_gen else n, rng)  # warm-up, as llama-bench does
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(ctx, n, rng)
        samples.append(n / (time.perf_counter() - t0))
    test = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
    return BenchResult(test, n_prompt, n_gen, n_threads, ctx.n_batch, ctx.n_ubatch, samples)
