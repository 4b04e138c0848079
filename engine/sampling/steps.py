"""The chain's steps: llama.cpp's samplers, each a function from a candidate list to a new one.

A candidate list (`Candidates`) is llama.cpp's llama_token_data_array: token ids and their
logits in the order llama.cpp's chain holds them, and whether that order is by logit. Each
step keeps llama.cpp's order too:

- top-k leaves the list sorted by logit, highest first; typical reorders it by its score;
  when no step sorts, it stays in id order (a fresh list is the whole vocabulary);
- a step removes tokens by leaving them out, except top-n-sigma, which sets them to -inf as
  llama.cpp's does; banned (-inf) tokens stay in the list, where its size enters XTC, dynamic
  temperature and min_keep (a -inf candidate has weight 0 and is never drawn).

The logit bias (`bias_arrays`, `add_bias`) runs on the logits vector before the list exists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from .kernels import (
    FLT_MAX,
    bucket_sort,
    dist_index,
    dynamic_temp,
    keep_count,
    logf,
    sigma_floor,
    softmax_f32,
    sort_order,
    typical_scores,
)
from .std_random import StdMt19937
from .std_sort import std_sort

_NEG_INF = np.float32(-np.inf)
# top-p on an unsorted list longer than this first sorts only its head (as llama.cpp does)
_TOP_P_UNSORTED = 1024
_TOP_P_HEAD = 256


# -- the logit bias: on the logits vector (n_vocab,) ------------------------------------------


def bias_arrays(bias: Mapping[int, float], n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """A logit-bias mapping as (ids, values) arrays, ids outside the vocabulary dropped.

    The values are rounded to float32 (llama.cpp holds biases in floats) but kept as float64:
    a float32 plus a float32 summed in float64 and rounded to float32 is the float32 sum, and
    the float64 sum can be saturated where the float32 one would overflow.
    """
    pairs = [(t, b) for t, b in bias.items() if 0 <= t < n_vocab]
    with np.errstate(over="ignore"):
        values = np.array([b for _, b in pairs], np.float64).astype(np.float32)
    return np.array([t for t, _ in pairs], np.int64), values.astype(np.float64)


def add_bias(logits: np.ndarray, ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`logits` with `values` added at `ids` (bias_arrays' pair): a copy, or `logits` itself
    when there is no bias. A -inf value bans its token."""
    if ids.size == 0:
        return logits
    out = logits.copy()
    x = out[ids] + values
    # float32 cannot hold every sum: saturate (one +inf logit makes every probability NaN)
    # but keep -inf, which is a ban
    out[ids] = np.where(x == -np.inf, x, np.clip(x, -FLT_MAX, FLT_MAX))
    return out


# -- candidates: llama.cpp's llama_token_data_array --------------------------------------------


class Candidates(NamedTuple):
    """The tokens still in the running, in the order llama.cpp's chain holds them.

    Attributes:
        ids: token ids (int64).
        logits: their logits (float32), same order.
        sorted: whether the order is by logit, highest first (llama.cpp's `sorted` flag,
            which decides where its softmax takes the maximum from).
    """

    ids: np.ndarray
    logits: np.ndarray
    sorted: bool = False

    @property
    def size(self) -> int:
        return int(self.ids.size)

    def take(self, idx: np.ndarray | slice, sorted: bool) -> Candidates:
        return Candidates(self.ids[idx], self.logits[idx], sorted)


# 0..n_vocab-1 by n_vocab, shared (read-only) by every fresh list of that vocabulary: a fresh
# list costs no arange, and `penalties` knows one by this array (only to go faster: its other
# path gives the same numbers)
_VOCAB_IDS: dict[int, np.ndarray] = {}


def _vocab_ids(n_vocab: int) -> np.ndarray:
    ids = _VOCAB_IDS.get(n_vocab)
    if ids is None:
        if len(_VOCAB_IDS) >= 8:  # (a few vocabularies per process)
            _VOCAB_IDS.clear()
        ids = _VOCAB_IDS[n_vocab] = np.arange(n_vocab)
        ids.setflags(write=False)
    return ids


def candidates_of(logits: np.ndarray) -> Candidates:
    """Every token in id order: llama.cpp's fresh array, banned (-inf) tokens included."""
    return Candidates(_vocab_ids(logits.shape[0]), np.ascontiguousarray(logits, np.float32), False)


def sort_candidates(c: Candidates) -> Candidates:
    """By logit, highest first. Up to 128 candidates, tied ones end up where llama.cpp's
    std::partial_sort puts them; above that, ties go by id."""
    return c if c.sorted else c.take(sort_order(c.logits, c.size), True)


# -- the steps, in llama.cpp's default order ---------------------------------------------------


def penalties(
    c: Candidates,
    history: Sequence[int],
    repeat_last_n: int = 64,
    repeat_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
) -> Candidates:
    """Penalise tokens seen in the last `repeat_last_n` tokens of `history` (llama.cpp rule);
    the list is left unsorted (the order no longer follows the logits).

    A positive logit is divided by `repeat_penalty` and a negative one multiplied by it (so
    the penalty always lowers it); then `count * frequency_penalty + presence_penalty` is
    subtracted. `repeat_last_n` -1 takes the whole history, 0 none.
    """
    args = (history, repeat_last_n, repeat_penalty, frequency_penalty, presence_penalty)
    if c.ids is _VOCAB_IDS.get(c.size):  # a fresh list: its logits are the vector, indexed by id
        return Candidates(c.ids, _penalize(c.logits, *args), False)
    if c.size == 0:
        return Candidates(c.ids, c.logits, False)
    # a list cut by earlier steps: through a vector that holds its ids (the others -inf)
    full = np.full(int(c.ids.max()) + 1, -np.inf, np.float32)
    full[c.ids] = c.logits
    return Candidates(c.ids, _penalize(full, *args)[c.ids], False)


def _penalize(
    logits: np.ndarray,
    history: Sequence[int],
    repeat_last_n: int,
    repeat_penalty: float,
    frequency_penalty: float,
    presence_penalty: float,
) -> np.ndarray:
    """The penalties on a vector indexed by token id: a copy, or `logits` when none applies."""
    if repeat_last_n == 0 or not len(history):
        return logits
    if repeat_penalty == 1.0 and frequency_penalty == 0.0 and presence_penalty == 0.0:
        return logits
    window = np.asarray(history if repeat_last_n < 0 else history[-repeat_last_n:], np.int64)
    ids, n = np.unique(window[(window >= 0) & (window < logits.shape[0])], return_counts=True)
    if ids.size == 0:
        return logits
    n = n.astype(np.float32)
    out = logits.copy()
    x = out[ids]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        x = np.where(x <= 0, x * np.float32(repeat_penalty), x / np.float32(repeat_penalty))
        x = x - (n * np.float32(frequency_penalty) + np.float32(presence_penalty))
    # a penalty of 0 (or absurd ones) would give inf, and inf - inf is NaN in the softmax
    out[ids] = np.nan_to_num(x, nan=-FLT_MAX, posinf=FLT_MAX, neginf=-np.inf)
    return out


def top_n_sigma(c: Candidates, n: float) -> Candidates:
    """Set to -inf the logits below max - n * std (float32 mean and deviation over the finite
    logits, in list order); they stay in the list as in llama.cpp. n <= 0 keeps all."""
    n32 = np.float32(n)
    if n32 <= 0.0 or c.size <= 1:
        return c
    floor = sigma_floor(c.logits, n32)
    return Candidates(c.ids, np.where(c.logits < floor, _NEG_INF, c.logits), c.sorted)


def top_k(c: Candidates, k: int) -> Candidates:
    """The `k` highest logits, sorted; k <= 0 keeps the list as it is."""
    if k <= 0:
        return c
    if c.sorted:
        return c.take(slice(0, k), True)
    return c.take(sort_order(c.logits, min(k, c.size)), True)


def typical(c: Candidates, p: float, min_keep: int = 0) -> Candidates:
    """Locally typical sampling: order by |surprise - entropy| and keep the head whose
    probability first exceeds `p`; p >= 1 keeps all. Leaves the list unsorted."""
    p32 = np.float32(p)
    if p32 >= 1.0 or c.size == 0:
        return c
    c = sort_candidates(c)
    probs = softmax_f32(c.logits, True)
    order = np.arange(c.size)  # std::sort by score, ascending: by -score with comp ">"
    std_sort(-typical_scores(probs), order, 0, c.size)
    n = keep_count(probs[order], p32, min_keep, True, c.size)
    return c.take(order[:n], False)


def top_p(c: Candidates, p: float, min_keep: int = 0) -> Candidates:
    """Nucleus sampling: keep the most likely tokens until their probability reaches `p`;
    p >= 1 keeps all. Leaves the list sorted."""
    p32 = np.float32(p)
    if p32 >= 1.0 or c.size == 0:
        return c
    probs = softmax_f32(c.logits, c.sorted)  # summed in the list's current order
    if not c.sorted:
        if c.size > _TOP_P_UNSORTED:  # the head usually holds mass p: sort only it first
            head = bucket_sort(c.logits, _TOP_P_HEAD)[:_TOP_P_HEAD]
            n = keep_count(probs[head], p32, min_keep, False, -1)
            if n > 0:
                return c.take(head[:n], True)
        order = sort_order(c.logits, c.size)
        c, probs = c.take(order, True), probs[order]
    return c.take(slice(0, keep_count(probs, p32, min_keep, False, c.size)), True)


def min_p(c: Candidates, p: float, min_keep: int = 0) -> Candidates:
    """Keep tokens whose probability is at least `p` times the top token's (compared as
    logits: logit >= max + logf(p)); p <= 0 keeps all."""
    p32 = np.float32(p)
    if p32 <= 0.0 or c.size == 0:
        return c
    log_p = np.float32(logf(p32))
    if not c.sorted:
        # llama.cpp starts its maximum at -FLT_MAX: an all -inf list keeps nothing here
        keep = np.flatnonzero(c.logits >= max(c.logits.max(), np.float32(-FLT_MAX)) + log_p)
        if keep.size and keep.size >= min_keep:
            return c.take(keep, False)
        c = sort_candidates(c)
    below = (c.logits[1:] < c.logits[0] + log_p) & (np.arange(1, c.size) >= min_keep)
    return c.take(slice(0, 1 + int(np.argmax(below)) if below.any() else c.size), True)


def xtc(
    c: Candidates, probability: float, threshold: float, min_keep: int, rng: StdMt19937
) -> Candidates:
    """Exclude top choices: with chance `probability`, drop every token whose probability is
    at least `threshold` except the least likely of them. Draws from `rng` whenever enabled
    and two or more candidates are left, as llama.cpp's does."""
    p32, t32 = np.float32(probability), np.float32(threshold)
    if p32 <= 0.0 or t32 > 0.5 or c.size < 2:
        return c
    if rng.canonical_float() > p32:
        return c
    c = sort_candidates(c)
    above = softmax_f32(c.logits, True) >= t32
    last = c.size if above.all() else int(np.argmin(above))  # the first below the threshold
    last -= 1  # the last above it stays
    if last > 0 and c.size - last >= min_keep:
        return c.take(slice(last, None), True)
    return c


def dynamic_temperature(c: Candidates, t: float, delta: float, exponent: float) -> Candidates:
    """llama.cpp's temp_ext: with `delta` > 0 the temperature runs from t - delta (not below 0)
    to t + delta with the normalised entropy of the list, to the power `exponent`."""
    d32 = np.float32(delta)
    if d32 <= 0.0:
        return temperature(c, t)
    if c.size <= 1:
        return c
    c = sort_candidates(c)
    dyn = dynamic_temp(softmax_f32(c.logits, True), np.float32(t), d32, np.float32(exponent))
    return temperature(c, dyn)


def temperature(c: Candidates, t: float) -> Candidates:
    """Divide the logits by `t` (as a float32); t <= 0 keeps only the first highest, and so
    does a t that is 0 as a float32, as in llama.cpp (which holds it in a float)."""
    if c.size == 0:
        return c
    t32 = np.float32(t)
    if t32 <= 0.0:
        i = int(np.argmax(c.logits))
        return c.take(slice(i, i + 1), c.sorted)
    if t32 == 1.0:
        return c
    with np.errstate(over="ignore"):
        x = c.logits / t32
        if np.isposinf(x).any():
            # A tiny temperature: shifted first (the softmax does not see a shift), the others
            # go to -inf instead of the largest to +inf, where inf - inf would be NaN.
            x = ((c.logits - c.logits.max()) / np.float64(t)).astype(np.float32)
    return Candidates(c.ids, x, c.sorted)


def sample_dist(c: Candidates, rng: StdMt19937) -> int:
    """Draw one token id from softmax(c.logits) with one canonical double from `rng`.

    The draw is taken even when one candidate is left, as llama.cpp's does, so the generator
    stays in step with it.
    """
    u = rng.canonical()
    if c.size == 0:
        raise ValueError("no candidate to draw from")
    if c.size == 1:
        return int(c.ids[0])
    return int(c.ids[dist_index(c.logits, c.sorted, u)])
