"""Perplexity with llama-perplexity's method (chunks of n_ctx, score the second half)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..batch import Batch
from ..errors import EngineError


@dataclass(frozen=True)
class PerplexityChunk:
    index: int  # 0-based chunk number
    ppl: float  # running estimate after this chunk
    seconds: float


@dataclass(frozen=True)
class PerplexityResult:
    ppl: float
    stderr: float  # of the PPL, as llama-perplexity computes it
    n_chunks: int
    n_tokens_scored: int


def log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Natural log-probability of targets[i] under row i of logits (float64 accumulation)."""
    lg = logits.astype(np.float64)
    mx = lg.max(axis=1, keepdims=True)
    lse = np.log(np.exp(lg - mx).sum(axis=1)) + mx[:, 0]
    return lg[np.arange(len(targets)), targets] - lse


def perplexity(
    ctx,
    tokens: list[int],
    n_ctx: int,
    bos_id: int | None,
    n_chunks: int = -1,
    on_chunk: Callable[[PerplexityChunk], None] | None = None,
) -> PerplexityResult:
    """Score `tokens` (already tokenized with special tokens added) in chunks of n_ctx.

    Each chunk starts from an empty cache; with a BOS model its first token becomes BOS.
    Positions n_ctx/2 .. n_ctx-2 each predict the next token.
    """
    if n_ctx < 4:
        raise EngineError(f"context size {n_ctx} is too small for perplexity (need >= 4)")
    total = len(tokens) // n_ctx
    if total == 0:
        raise EngineError(
            f"need at least {n_ctx} tokens for one chunk of {n_ctx}, the text has {len(tokens)}"
        )
    if n_chunks > 0:
        total = min(total, n_chunks)
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    t0 = time.perf_counter()
    for c in range(total):
        chunk = np.array(tokens[c * n_ctx : (c + 1) * n_ctx], np.int32)
        if bos_id is not None:
            chunk[0] = bos_id
        want = np.zeros(n_ctx, np.bool_)
        want[first : n_ctx - 1] = True
        ctx.kv.seq_clear(0)
        batch = Batch.make(chunk, np.arange(n_ctx), np.zeros(n_ctx), want)
        logits = ctx.decode(batch)
        lp = log_softmax_at(logits, chunk[first + 1 :])
        nll -= lp.sum()
        nll2 += (lp * lp).sum()
        count += len(lp)
        if on_chunk:
            on_chunk(PerplexityChunk(c, math.exp(nll / count), time.perf_counter() - t0))
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    err = math.sqrt(var / (count - 1)) * ppl if var > 0 and count > 1 else 0.0
    return PerplexityResult(ppl, err, total, count)
