"""The common sampler chains in one numba call, the same arithmetic as the steps one by one.

Between two decodes each step costs ~10-50 µs (numpy calls on cold caches), ~0.2 ms a token
in all; the two chains nearly every request runs are fused here: greedy (the arg-max, when it
is unique), and top-k (k <= 128) followed by top-p, min-p and a temperature > 0, in that
order, after the logit bias and without penalties. tests/test_sampling.py pins the fused
candidates and draws to the step-by-step chain's (steps.py) on rows with ties and bans.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..jit import exact_kernel
from .kernels import FLT_MAX, HEAP_SORT_MAX, keep_count, logf, softmax_f32
from .params import SamplingParams
from .std_sort import heap_top
from .steps import Candidates

GREEDY, TOP_K = 0, 1  # fused_chain's modes
# the chains the top-k mode runs (after the logit bias), by their active steps
_TOP_K_CHAINS = {
    ("top_k", "temperature"),
    ("top_k", "top_p", "temperature"),
    ("top_k", "min_p", "temperature"),
    ("top_k", "top_p", "min_p", "temperature"),
}


class FusedChain:
    """One sampler's chain as fused_chain runs it, with the buffers it fills.

    Attributes:
        mode: GREEDY or TOP_K.
        k: top-k's k (0 for GREEDY).
    """

    def __init__(self, params: SamplingParams, mode: int):
        p = params
        self.mode = mode
        self.k = p.top_k if mode == TOP_K else 0
        min_p_on = bool(np.float32(p.min_p) > 0.0)
        log_p = np.float32(logf(np.float32(p.min_p))) if min_p_on else np.float32(0.0)
        # fused_chain's arguments after the bias (top_p, t and log_p as llama.cpp's floats)
        self._args = (
            mode,
            self.k,
            np.float32(p.top_p),
            p.min_keep,
            min_p_on,
            log_p,
            np.float32(p.temperature),
        )
        self._bufs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @classmethod
    def of(
        cls, params: SamplingParams, steps: Sequence[str], argmax_only: bool
    ) -> FusedChain | None:
        """The fused form of a chain (its active `steps`; `argmax_only` when greedy and nothing
        can drop the arg-max), or None when it has none."""
        p = params
        if argmax_only and steps[0] != "penalties":
            return cls(p, GREEDY)
        if (
            tuple(steps) in _TOP_K_CHAINS
            and 0 < p.top_k <= HEAP_SORT_MAX
            and np.float32(p.temperature) > 0.0
            and np.float32(p.dynatemp_range) <= 0.0
        ):
            return cls(p, TOP_K)
        return None

    def candidates(
        self, x: np.ndarray, bias_ids: np.ndarray, bias_vals: np.ndarray
    ) -> Candidates | None:
        """The chain's candidates for the row `x` (n_vocab,) float32 and the bias arrays; None
        where it leaves the decision to the step-by-step chain (tied or NaN arg-max, a top-k
        not below the vocabulary)."""
        if x.ndim != 1 or (self.mode == TOP_K and self.k >= x.shape[0]):
            return None
        if self._bufs is None:
            k = max(1, self.k)
            self._bufs = (
                np.empty(bias_ids.size, np.float32),
                np.empty(k, np.int64),
                np.empty(k, np.float32),
            )
        saved, ids, out = self._bufs
        if bias_ids.size and not (x.flags.writeable and x.flags.c_contiguous):
            x = x.copy()  # the kernel writes the bias into the row for the time of the call
        n = fused_chain(x, saved, bias_ids, bias_vals, *self._args, ids, out)
        return Candidates(ids[:n].copy(), out[:n].copy(), True) if n > 0 else None


@exact_kernel
def fused_chain(
    x: np.ndarray,
    saved: np.ndarray,
    bias_ids: np.ndarray,
    bias_vals: np.ndarray,
    mode: int,
    k: int,
    top_p: np.float32,
    min_keep: int,
    min_p_on: bool,
    log_p: np.float32,
    t: np.float32,
    ids: np.ndarray,
    out: np.ndarray,
) -> int:  # pragma: no cover - numba
    """Sampler.candidates for a chain without penalties: the logit bias (add_bias, and the
    unbiased logits when it bans everything), then either the arg-max (mode GREEDY,
    when it is unique) or top-k (k <= 128, below the vocabulary) with top-p (< 1), min-p
    (min_p_on) and a temperature t > 0. Leaves the candidates in ids[:n], their logits in
    out[:n] (sorted, highest first) and returns n; 0 where the caller's general path decides.

    The bias is written into `x` itself and undone before returning (`saved` holds the
    biased entries' logits): a copy of the row would cost more than the rest."""
    for j in range(bias_ids.size):
        i = bias_ids[j]
        saved[j] = x[i]
        v = np.float64(x[i]) + bias_vals[j]
        if v != -np.inf and v == v:  # np.clip keeps -inf and NaN
            v = min(max(v, -FLT_MAX), FLT_MAX)
        x[i] = v
    if bias_ids.size:
        alive = False
        for i in range(x.size):
            if x[i] > -np.inf:
                alive = True
                break
        if not alive:
            for j in range(bias_ids.size):
                x[bias_ids[j]] = saved[j]
    n = _fused_body(x, mode, k, top_p, min_keep, min_p_on, log_p, t, ids, out)
    for j in range(bias_ids.size):
        x[bias_ids[j]] = saved[j]
    return n


@exact_kernel
def _fused_body(
    x: np.ndarray,
    mode: int,
    k: int,
    top_p: np.float32,
    min_keep: int,
    min_p_on: bool,
    log_p: np.float32,
    t: np.float32,
    ids: np.ndarray,
    out: np.ndarray,
) -> int:  # pragma: no cover - numba
    """fused_chain on the biased row."""
    if mode == GREEDY:
        best = heap_top(x, 1)[0]  # the first arg-max (a vectorised scan; np.argmax is not)
        m = x[best]
        n_max = 0
        nan = False
        for i in range(x.size):
            n_max += x[i] == m
            nan |= x[i] != x[i]
        if n_max != 1 or nan:  # tied (or NaN): the chain's order picks among them
            return 0
        ids[0] = best
        out[0] = m
        return 1
    h = heap_top(x, k)
    n = h.size
    for i in range(n):
        ids[i] = h[i]
        out[i] = x[h[i]]
    if top_p < 1.0:
        n = keep_count(softmax_f32(out[:n], True), top_p, min_keep, False, n)
    if min_p_on:
        cut = out[0] + log_p
        for i in range(1, n):
            if out[i] < cut and i >= min_keep:
                n = i
                break
    if t != 1.0:
        inf = False
        for i in range(n):
            out[i] = out[i] / t
            inf |= out[i] == np.inf
        if inf:  # as temperature(): shifted first, in double
            top = x[ids[0]]
            for i in range(1, n):
                top = max(top, x[ids[i]])
            for i in range(n):
                out[i] = np.float32((x[ids[i]] - top) / np.float64(t))
    return n
