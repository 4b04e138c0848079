"""What a step reports beside its token: log-probabilities of the raw logits, and the
probabilities the draw used (llama-server's post_sampling_probs).

The log-probabilities are a plain log-softmax of the model's logits, before any sampling
step, as llama.cpp's server reports them by default.
"""

from __future__ import annotations

import math

import numpy as np

from .kernels import softmax_f32
from .steps import Candidates

_NEG_INF = np.float32(-np.inf)


def logsumexp(logits: np.ndarray) -> float:
    """log(sum(exp(logits))): the normaliser of a plain softmax."""
    m = np.max(logits)
    e = np.subtract(logits, m, dtype=np.float32)
    # below -87 expf is subnormal (x86 then runs ~10x slower); such terms add < 2e-38 each
    np.maximum(e, np.float32(-87.0), out=e)
    np.exp(e, out=e)
    # numpy's float32 sum is pairwise: ~1e-7 relative here, at a fifth of a float64 sum's cost
    return float(m) + math.log(float(np.add.reduce(e, dtype=np.float32)))


def top_logprobs(
    logits: np.ndarray, n: int, lse: float | None = None
) -> tuple[tuple[int, float], ...]:
    """The `n` most likely (token, logprob) pairs of softmax(logits), most likely first
    (ties: lower id first). `lse` is logsumexp(logits) when the caller already has it."""
    if n <= 0:
        return ()
    lse = logsumexp(logits) if lse is None else lse
    ids = top_k_ids(logits, n)
    ids = ids[np.lexsort((ids, -logits[ids]))]
    return tuple((int(t), float(logits[t]) - lse) for t in ids)


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ascending ids of the `k` largest finite logits (ties go to the lower id); all finite
    ids when k <= 0 or there are no more than k of them."""
    n = logits.shape[0]
    if k <= 0 or k >= n:
        return _alive(logits)
    # A full partition costs ~3 ms on a 262k vocabulary. The k-th largest of every 64th logit
    # is a threshold that at least k logits reach, which leaves ~64k candidates to partition.
    cand = _alive(logits)
    if n >= 64 * k:
        sub = logits[::64]
        t = np.partition(sub, sub.size - k)[sub.size - k]
        if t > _NEG_INF:
            cand = np.flatnonzero(logits >= t)
    if k >= cand.size:
        return cand
    x = logits[cand]
    kth = np.partition(x, x.size - k)[x.size - k]
    above = cand[x > kth]
    ties = cand[x == kth][: k - above.size]
    return np.sort(np.concatenate([above, ties]))


def _alive(logits: np.ndarray) -> np.ndarray:
    """Ids of the tokens still in the running (finite logit), ascending."""
    return np.flatnonzero(logits > _NEG_INF)


def candidate_probs(
    c: Candidates, n: int, token: int
) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The probabilities a draw from `c` had: `token`'s, and the `n` highest (highest first,
    ties by id, zeros left out), as llama-server reports post_sampling_probs."""
    if c.size == 0:
        return 0.0, ()
    p = softmax_f32(np.ascontiguousarray(c.logits, dtype=np.float32), c.sorted)
    hit = np.flatnonzero(c.ids == token)
    order = np.lexsort((c.ids, -p))[: max(n, 0)]
    return (float(p[hit[0]]) if hit.size else 0.0), tuple(
        (int(c.ids[i]), float(p[i])) for i in order if p[i] > 0
    )
