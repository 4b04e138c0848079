"""Token sampling: one params object, llama.cpp's sampler chain and its seeded draw, bit for bit.

The chain follows llama.cpp's default order (common/sampling.cpp, src/llama-sampler.cpp):

    logit bias -> penalties -> [dry] -> top_n_sigma -> top_k -> typical -> top_p -> min_p
    -> xtc -> temperature (dynamic with dynatemp_range) -> dist

in that order unless SamplingParams.samplers gives another. DRY (off by default in llama.cpp)
and mirostat are not implemented. For a given seed the chain picks the tokens llama.cpp picks
from the same logits, because it works as llama.cpp's does, on a candidate list
(`Candidates`, llama.cpp's llama_token_data_array):

- the same candidates in the same order: top-k leaves them sorted by logit, highest first;
  typical reorders them by its score; when no step sorts, they stay in id order;
- the same float32 softmax, its sums taken in that order, with the C library's expf/logf
  (numba kernels built without fastmath call them, as llama.cpp does);
- the same draw: one `std::uniform_real_distribution<double>(0, 1)` number per token from a
  `std::mt19937` seeded with the seed (engine.std_random), then the first candidate whose
  running sum of unnormalised weights (float32, summed in double) reaches total * draw;
  XTC draws a float from its own generator seeded alike.

Even tied logits come out in llama.cpp's order: its sorts (std::partial_sort up to 128
candidates, its bucket sort with std::sort above, typical's std::sort) are replayed step for
step as libstdc++ runs them; and banned (-inf) tokens stay in the list as in llama.cpp's.

Every step of the default chain also has a full-vocabulary form (apply_*) that returns the
logits with removed tokens at -inf, for callers and tests that want one step on a hand-made
vector.

`temperature <= 0` keeps only the arg-max (llama.cpp's `temp_ext` does the same), so greedy
decoding still honours logit bias and penalties. Log-probabilities reported to callers are
those of the raw logits (a plain log-softmax), as llama.cpp's server reports them by default.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import numpy as np

from .jit import exact_kernel
from .std_random import StdMt19937

# llama.cpp's LLAMA_DEFAULT_SEED: "pick a random seed". -1 on the command line wraps to it.
DEFAULT_SEED = 0xFFFFFFFF
# common_params_sampling.samplers; the chain ends with dist
DEFAULT_SAMPLERS = (
    "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
)
# other spellings llama.cpp's common_sampler_types_from_names accepts
_SAMPLER_ALIASES = {
    "top-k": "top_k", "top-p": "top_p", "top-n-sigma": "top_n_sigma", "min-p": "min_p",
    "nucleus": "top_p", "typical": "typ_p", "typical-p": "typ_p", "typical_p": "typ_p",
    "typ-p": "typ_p", "typ": "typ_p", "temp": "temperature", "topk": "top_k", "topp": "top_p",
    "minp": "min_p", "topnsigma": "top_n_sigma", "top-nsigma": "top_n_sigma",
}
# llama.cpp's one-letter sampler codes (common_sampler_type_to_chr), e.g. --sampling-seq "kfypmt"
SAMPLER_CHARS = {
    "d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
    "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p",
}
_SAMPLER_NAMES = frozenset(SAMPLER_CHARS.values())


def sampler_names(value: Sequence[str] | str | None) -> tuple[str, ...]:
    """A `samplers` value (names in any of llama.cpp's spellings, or a string of one-letter
    codes) as llama.cpp's names; unknown ones are dropped, as llama.cpp drops them."""
    if value is None:
        return DEFAULT_SAMPLERS
    if isinstance(value, str):
        return tuple(SAMPLER_CHARS[c] for c in value if c in SAMPLER_CHARS)
    out = []
    for name in value:
        n = _SAMPLER_ALIASES.get(name.lower(), name.lower())
        if n in _SAMPLER_NAMES:
            out.append(n)
    return tuple(out)


_NEG_INF = np.float32(-np.inf)
_FLT_MAX = float(np.finfo(np.float32).max)
# top-p on an unsorted list longer than this first sorts only its head (as llama.cpp does)
_TOP_P_UNSORTED = 1024
# llama.cpp sorts up to this many candidates with std::partial_sort (a heap), more by buckets
_HEAP_SORT_MAX = 128
_TOP_P_HEAD = 256

_F32_MAX = float(np.finfo(np.float32).max)
_F32_MIN = -_F32_MAX


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling choices, with llama.cpp's defaults (common_params_sampling).

    `seed` -1 (or 0xFFFFFFFF) draws a random seed; `repeat_last_n` 0 disables the penalties
    and -1 means the whole history; `top_k` <= 0, `top_p` >= 1, `min_p` <= 0 and
    `typical_p` >= 1 disable their step; `temperature` <= 0 is greedy. `dynatemp_range` > 0
    picks the temperature per token in temperature +- range from the entropy (llama.cpp's
    dynamic temperature); `top_n_sigma` > 0 keeps logits within that many standard deviations
    of the top one; `xtc_probability` > 0 (with `xtc_threshold` <= 0.5) sometimes removes all
    but the least likely of the tokens above the threshold. `samplers` is the chain's order
    (llama.cpp's names; "dry" and names it does not know are skipped). `n_probs` > 0 asks for
    the log-probabilities of that many most likely tokens at each step; with
    `post_sampling_probs`, for their probabilities after the chain instead (those the draw used).
    `logprobs` False spares each step the sampled token's log-probability (GenerationStep.logprob
    NaN: a softmax over the whole vocabulary, ~0.1 ms a token); n_probs > 0 computes it anyway.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = -1
    n_probs: int = 0
    min_keep: int = 0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    ignore_eos: bool = False
    post_sampling_probs: bool = False
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    logprobs: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


# -- the chain: each step maps a logits vector (n_vocab,) to a new one ----------------------


def apply_logit_bias(logits: np.ndarray, bias: Mapping[int, float]) -> np.ndarray:
    """Add `bias[token]` to each listed token's logit (-inf bans it); ids out of range are ignored."""
    ids, values = bias_arrays(bias, logits.shape[0])
    return add_bias(logits, ids, values)


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
    if ids.size == 0:
        return logits
    out = logits.copy()
    x = out[ids] + values
    # float32 cannot hold every sum: saturate (one +inf logit makes every probability NaN)
    # but keep -inf, which is a ban
    out[ids] = np.where(x == -np.inf, x, np.clip(x, -_FLT_MAX, _FLT_MAX))
    return out


def apply_penalties(
    logits: np.ndarray,
    history: Sequence[int],
    repeat_last_n: int = 64,
    repeat_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
) -> np.ndarray:
    """Penalise tokens seen in the last `repeat_last_n` tokens of `history` (llama.cpp rule).

    A positive logit is divided by `repeat_penalty` and a negative one multiplied by it (so
    the penalty always lowers it); then `count * frequency_penalty + presence_penalty` is
    subtracted.
    """
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
    out[ids] = np.nan_to_num(x, nan=_F32_MIN, posinf=_F32_MAX, neginf=-np.inf)
    return out


# -- candidates: llama.cpp's llama_token_data_array ----------------------------------------


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


def candidates_of(logits: np.ndarray) -> Candidates:
    """Every token in id order: llama.cpp's fresh array. Banned (-inf) tokens stay in it, as
    they do in llama.cpp's, where the list's size enters XTC, dynamic temperature and min_keep
    (a -inf candidate has weight 0 and is never drawn)."""
    return Candidates(np.arange(logits.shape[0]), np.ascontiguousarray(logits, np.float32), False)


def sort_candidates(c: Candidates) -> Candidates:
    """By logit, highest first. Up to 128 candidates, tied ones end up where llama.cpp's
    std::partial_sort puts them; above that, ties go by id."""
    return c if c.sorted else c.take(_sort_order(c.logits, c.size), True)


def _sort_order(x: np.ndarray, k: int) -> np.ndarray:
    """llama_token_data_array_partial_sort_inplace: positions of the k largest of x, sorted,
    ties where llama.cpp leaves them (std::partial_sort up to 128, its bucket sort above)."""
    return _heap_top(x, k) if k <= _HEAP_SORT_MAX else _bucket_sort(x, k)[:k]


def top_k(c: Candidates, k: int) -> Candidates:
    """The `k` highest logits, sorted; k <= 0 keeps the list as it is."""
    if k <= 0:
        return c
    if c.sorted:
        return c.take(slice(0, k), True)
    return c.take(_sort_order(c.logits, min(k, c.size)), True)


def typical(c: Candidates, p: float, min_keep: int = 0) -> Candidates:
    """Locally typical sampling: order by |surprise - entropy| and keep the head whose
    probability first exceeds `p`; p >= 1 keeps all. Leaves the list unsorted."""
    p32 = np.float32(p)
    if p32 >= 1.0 or c.size == 0:
        return c
    c = sort_candidates(c)
    probs = _softmax_f32(c.logits, True)
    order = np.arange(c.size)  # std::sort by score, ascending: by -score with comp ">"
    _std_sort(-_typical_scores(probs), order, 0, c.size)
    n = _cut(probs[order], p32, min_keep, True, c.size)
    return c.take(order[:n], False)


def top_p(c: Candidates, p: float, min_keep: int = 0) -> Candidates:
    """Nucleus sampling: keep the most likely tokens until their probability reaches `p`;
    p >= 1 keeps all. Leaves the list sorted."""
    p32 = np.float32(p)
    if p32 >= 1.0 or c.size == 0:
        return c
    probs = _softmax_f32(c.logits, c.sorted)  # summed in the list's current order
    if not c.sorted:
        if c.size > _TOP_P_UNSORTED:  # the head usually holds mass p: sort only it first
            head = _bucket_sort(c.logits, _TOP_P_HEAD)[:_TOP_P_HEAD]
            n = _cut(probs[head], p32, min_keep, False, -1)
            if n > 0:
                return c.take(head[:n], True)
        order = _sort_order(c.logits, c.size)
        c, probs = c.take(order, True), probs[order]
    return c.take(slice(0, _cut(probs, p32, min_keep, False, c.size)), True)


def min_p(c: Candidates, p: float, min_keep: int = 0) -> Candidates:
    """Keep tokens whose probability is at least `p` times the top token's (compared as
    logits: logit >= max + logf(p)); p <= 0 keeps all."""
    p32 = np.float32(p)
    if p32 <= 0.0 or c.size == 0:
        return c
    log_p = np.float32(_logf(p32))
    if not c.sorted:
        # llama.cpp starts its maximum at -FLT_MAX: an all -inf list keeps nothing here
        keep = np.flatnonzero(c.logits >= max(c.logits.max(), np.float32(_F32_MIN)) + log_p)
        if keep.size and keep.size >= min_keep:
            return c.take(keep, False)
        c = sort_candidates(c)
    below = (c.logits[1:] < c.logits[0] + log_p) & (np.arange(1, c.size) >= min_keep)
    return c.take(slice(0, 1 + int(np.argmax(below)) if below.any() else c.size), True)


def top_n_sigma(c: Candidates, n: float) -> Candidates:
    """Set to -inf the logits below max - n * std (float32 mean and deviation over the finite
    logits, in list order); they stay in the list as in llama.cpp. n <= 0 keeps all."""
    n32 = np.float32(n)
    if n32 <= 0.0 or c.size <= 1:
        return c
    floor = _sigma_floor(c.logits, n32)
    return Candidates(c.ids, np.where(c.logits < floor, _NEG_INF, c.logits), c.sorted)


def xtc(c: Candidates, probability: float, threshold: float, min_keep: int,
        rng: StdMt19937) -> Candidates:
    """Exclude top choices: with chance `probability`, drop every token whose probability is
    at least `threshold` except the least likely of them. Draws from `rng` whenever enabled
    and two or more candidates are left, as llama.cpp's does."""
    p32, t32 = np.float32(probability), np.float32(threshold)
    if p32 <= 0.0 or t32 > 0.5 or c.size < 2:
        return c
    if rng.canonical_float() > p32:
        return c
    c = sort_candidates(c)
    above = _softmax_f32(c.logits, True) >= t32
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
    dyn = _dynamic_temp(_softmax_f32(c.logits, True), np.float32(t), d32, np.float32(exponent))
    return temperature(c, dyn)


def temperature(c: Candidates, t: float) -> Candidates:
    """Divide the logits by `t` (as a float32); t <= 0 keeps only the first highest."""
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
    return int(c.ids[_dist_index(c.logits, c.sorted, u)])


# -- the same steps on a full-vocabulary vector --------------------------------------------
# Each maps logits (n_vocab,) to a copy with the removed tokens at -inf; the candidates are
# all finite tokens in id order, as in a fresh llama.cpp array.


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the `k` largest logits (ties at the edge go to the lower id); k <= 0 keeps all."""
    ids = top_k_ids(logits, k)
    return logits if ids.size == _alive(logits).size else _keep(logits, ids)


def apply_typical(logits: np.ndarray, p: float, min_keep: int = 0) -> np.ndarray:
    """`typical` on the whole vector; p >= 1 returns it unchanged."""
    if np.float32(p) >= 1.0:
        return logits
    return _keep(logits, typical(candidates_of(logits), p, min_keep).ids)


def apply_top_p(logits: np.ndarray, p: float, min_keep: int = 0) -> np.ndarray:
    """`top_p` on the whole vector; p >= 1 returns it unchanged."""
    if np.float32(p) >= 1.0:
        return logits
    return _keep(logits, top_p(candidates_of(logits), p, min_keep).ids)


def apply_min_p(logits: np.ndarray, p: float, min_keep: int = 0) -> np.ndarray:
    """`min_p` on the whole vector; p <= 0 returns it unchanged."""
    if np.float32(p) <= 0.0:
        return logits
    return _keep(logits, min_p(candidates_of(logits), p, min_keep).ids)


def apply_temperature(logits: np.ndarray, t: float) -> np.ndarray:
    """Divide by the temperature; temperature <= 0 keeps only the arg-max (greedy), and so does
    one that is 0 as a float32, as in llama.cpp (which holds it in a float)."""
    if np.float32(t) == 1.0:
        return logits
    c = temperature(candidates_of(logits), t)
    out = np.full_like(logits, _NEG_INF)
    out[c.ids] = c.logits
    return out


# -- log-probabilities of the raw logits ---------------------------------------------------


def logsumexp(logits: np.ndarray) -> float:
    """log(sum(exp(logits))): the normaliser of a plain softmax."""
    m = np.max(logits)
    e = np.subtract(logits, m, dtype=np.float32)
    # below -87 expf is subnormal (x86 then runs ~10x slower); such terms add < 2e-38 each
    np.maximum(e, np.float32(-87.0), out=e)
    np.exp(e, out=e)
    # numpy's float32 sum is pairwise: ~1e-7 relative here, at a fifth of a float64 sum's cost
    return float(m) + math.log(float(np.add.reduce(e, dtype=np.float32)))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural-log softmax, shape (n_vocab,) float64 (tests and small vocabularies)."""
    return logits.astype(np.float64) - logsumexp(logits)


def top_logprobs(logits: np.ndarray, n: int, lse: float | None = None) -> tuple[tuple[int, float], ...]:
    """The `n` most likely (token, logprob) pairs of softmax(logits), most likely first
    (ties: lower id first). `lse` is logsumexp(logits) when the caller already has it."""
    if n <= 0:
        return ()
    lse = logsumexp(logits) if lse is None else lse
    ids = top_k_ids(logits, n)
    ids = ids[np.lexsort((ids, -logits[ids]))]
    return tuple((int(t), float(logits[t]) - lse) for t in ids)


# -- the sampler ---------------------------------------------------------------------------


class Sampler:
    """The chain built from one SamplingParams, with its own std::mt19937.

    Attributes:
        params: the parameters it was built from.
        seed: the seed actually used (a random one when params.seed asked for it).
    """

    def __init__(self, params: SamplingParams, eog_ids: Iterable[int] = ()):
        self.params = params
        self.seed = resolve_seed(params.seed)
        self.rng = StdMt19937(self.seed)
        self._xtc_rng = StdMt19937(self.seed)  # llama.cpp's XTC seeds its own generator
        bias = dict(params.logit_bias)
        if params.ignore_eos:  # llama.cpp bans every end-of-generation token
            bias.update({int(t): -np.inf for t in eog_ids})
        self._bias = bias
        self._bias_arrays: tuple[np.ndarray, np.ndarray] | None = None  # built for the first row
        self.last_candidates: Candidates | None = None  # what the last draw chose from
        self._steps = active_steps(params)
        # Greedy: top-n-sigma, top-k, top-p and min-p keep the arg-max, then temperature keeps
        # only it. Typical and XTC can drop it, and penalties change it unless they come first.
        self._argmax_only = (
            np.float32(params.temperature) <= 0.0 and np.float32(params.dynatemp_range) <= 0.0
            and "temperature" in self._steps and not {"typ_p", "xtc"} & set(self._steps)
            and "penalties" not in self._steps[1:]
        )
        self._fused = _fused_plan(params, self._steps, self._argmax_only)
        self._fused_bufs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def candidates(self, logits: np.ndarray, history: Sequence[int] = ()) -> Candidates:
        """Run every step but the draw: the candidates `dist` draws from, in llama.cpp's order."""
        p = self.params
        x = np.asarray(logits, dtype=np.float32)
        if self._bias_arrays is None:
            self._bias_arrays = bias_arrays(self._bias, x.shape[0])
        plan = self._fused
        if plan is not None and x.ndim == 1 and (plan[0] == _FAST_GREEDY or p.top_k < x.shape[0]):
            fused = self._fused_candidates(x, plan)
            if fused is not None:
                return fused
        biased = add_bias(x, *self._bias_arrays)
        # A bias that bans every token leaves nothing to draw. llama.cpp's chain never empties
        # (its bias only lowers logits to -inf) and its dist sampler then falls back to
        # whichever candidate it holds last; here the step runs as if unbiased instead.
        if biased is not x and np.any(biased > _NEG_INF):
            x = biased
        penalize = partial(apply_penalties, history=history, repeat_last_n=p.repeat_last_n,
                           repeat_penalty=p.repeat_penalty, frequency_penalty=p.frequency_penalty,
                           presence_penalty=p.presence_penalty)
        steps = self._steps
        if self._argmax_only:
            if steps[0] == "penalties":  # (the only place they can be here)
                x, steps = penalize(x), steps[1:]
            i = int(np.argmax(x))
            if np.count_nonzero(x == x[i]) == 1:  # else the chain's order picks among the tied
                return Candidates(np.array([i]), x[i : i + 1], True)
        c: Candidates | None = None  # None while the list is still the whole vector `x`
        for step in steps:
            if step == "penalties":
                if c is None:
                    x = penalize(x)
                else:  # penalties after a step that cut the list: on its tokens only
                    full = np.full_like(x, _NEG_INF)
                    full[c.ids] = c.logits
                    c = Candidates(c.ids, penalize(full)[c.ids], False)
                continue
            if step == "top_k" and c is None and 0 < p.top_k < x.shape[0]:
                # the common case: one pass over the vocabulary, -inf (banned) tokens included
                # as they are in llama.cpp's array, so that ties come out in its order
                ids = _sort_order(x, p.top_k)  # banned tokens too, as llama.cpp keeps them
                c = Candidates(ids, x[ids], True)
                continue
            c = candidates_of(x) if c is None else c
            if step == "top_n_sigma":
                c = top_n_sigma(c, p.top_n_sigma)
            elif step == "top_k":
                c = top_k(c, p.top_k)
            elif step == "typ_p":
                c = typical(c, p.typical_p, p.min_keep)
            elif step == "top_p":
                c = top_p(c, p.top_p, p.min_keep)
            elif step == "min_p":
                c = min_p(c, p.min_p, p.min_keep)
            elif step == "xtc":
                c = xtc(c, p.xtc_probability, p.xtc_threshold, p.min_keep, self._xtc_rng)
            elif step == "temperature":
                c = dynamic_temperature(c, p.temperature, p.dynatemp_range, p.dynatemp_exponent)
        return candidates_of(x) if c is None else c

    def _fused_candidates(self, x: np.ndarray, plan: tuple) -> Candidates | None:
        """candidates() in one kernel call (_fused_chain); None where it leaves the decision
        to the step-by-step chain."""
        assert self._bias_arrays is not None
        if self._fused_bufs is None:
            k = max(1, self.params.top_k)
            self._fused_bufs = (np.empty(self._bias_arrays[0].size, np.float32), np.empty(k, np.int64),
                                np.empty(k, np.float32))
        saved, ids, out = self._fused_bufs
        if self._bias_arrays[0].size and not (x.flags.writeable and x.flags.c_contiguous):
            x = x.copy()  # the kernel writes the bias into the row for the time of the call
        n = _fused_chain(x, saved, *self._bias_arrays, *plan, ids, out)
        return Candidates(ids[:n].copy(), out[:n].copy(), True) if n > 0 else None

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """Pick the next token from one row of logits (n_vocab,) given the token history
        (prompt + generated so far, used by the penalties)."""
        c = self.last_candidates = self.candidates(logits, history)
        if c.size == 0:  # every token -inf: fall back to the arg-max like a greedy sampler
            self.rng.canonical()
            return int(np.argmax(logits))
        return sample_dist(c, self.rng)


def candidate_probs(c: Candidates, n: int, token: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The probabilities a draw from `c` had: `token`'s, and the `n` highest (highest first,
    ties by id, zeros left out), as llama-server reports post_sampling_probs."""
    if c.size == 0:
        return 0.0, ()
    p = _softmax_f32(np.ascontiguousarray(c.logits, dtype=np.float32), c.sorted)
    hit = np.flatnonzero(c.ids == token)
    order = np.lexsort((c.ids, -p))[: max(n, 0)]
    return (float(p[hit[0]]) if hit.size else 0.0), tuple((int(c.ids[i]), float(p[i])) for i in order if p[i] > 0)


# the chains _fused_chain runs (after the logit bias), by their active steps
_FUSED_CHAINS = {
    ("top_k", "temperature"), ("top_k", "top_p", "temperature"), ("top_k", "min_p", "temperature"),
    ("top_k", "top_p", "min_p", "temperature"),
}


def _fused_plan(params: SamplingParams, steps: Sequence[str], argmax_only: bool) -> tuple | None:
    """_fused_chain's arguments after the bias for a chain it runs (the greedy one, or top-k
    <= 128 followed by top-p, min-p and a temperature > 0, in that order); None for others."""
    p = params
    top_p, t = np.float32(p.top_p), np.float32(p.temperature)
    min_p_on = bool(np.float32(p.min_p) > 0.0)
    log_p = np.float32(_logf(np.float32(p.min_p))) if min_p_on else np.float32(0.0)
    if argmax_only and steps[0] != "penalties":
        return (_FAST_GREEDY, 0, top_p, p.min_keep, min_p_on, log_p, t)
    if (tuple(steps) in _FUSED_CHAINS and 0 < p.top_k <= _HEAP_SORT_MAX and t > 0.0
            and np.float32(p.dynatemp_range) <= 0.0):
        return (_FAST_TOP_K, p.top_k, top_p, p.min_keep, min_p_on, log_p, t)
    return None


def active_steps(params: SamplingParams) -> list[str]:
    """The steps of `params.samplers` that would change something, in order ("temperature"
    always, so that the list is what llama.cpp's dist sees; unknown names and "dry" dropped)."""
    p = params
    on = {
        "penalties": p.repeat_last_n != 0 and (
            p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0),
        "top_n_sigma": np.float32(p.top_n_sigma) > 0.0,
        "top_k": p.top_k > 0,
        "typ_p": np.float32(p.typical_p) < 1.0,
        "top_p": np.float32(p.top_p) < 1.0,
        "min_p": np.float32(p.min_p) > 0.0,
        "xtc": np.float32(p.xtc_probability) > 0.0 and np.float32(p.xtc_threshold) <= 0.5,
        "temperature": True,
    }
    names = (_SAMPLER_ALIASES.get(n, n) for n in p.samplers)
    return [n for n in names if on.get(n, False)]


def warm_up() -> None:
    """Compile (or load from numba's cache) the sampler's kernels, so the first request with
    any sampling step does not pay for it."""
    x = np.array([2.0, 1.0, 0.5, -1.0], np.float32)
    for p in (
        SamplingParams(seed=0, top_n_sigma=3.0, typical_p=0.99, xtc_probability=1.0),
        SamplingParams(seed=0, dynatemp_range=0.5),
        SamplingParams(seed=0, top_k=0),  # top-p and dist on an unsorted list
    ):
        make_sampler(p).sample(x)
    for p in (SamplingParams(seed=0, top_k=2), SamplingParams(seed=0, temperature=0.0, top_k=2)):
        make_sampler(p, eog_ids=(3,)).sample(x)  # the fused chains, with and without a bias
        make_sampler(p).sample(x)
    _bucket_sort(x, 2)  # top-k above 128 and long lists


def make_sampler(params: SamplingParams, eog_ids: Iterable[int] = ()) -> Sampler:
    """Build the sampler chain for `params`; `eog_ids` are banned when params.ignore_eos."""
    return Sampler(params, eog_ids)


def resolve_seed(seed: int) -> int:
    """Map a user seed to a uint32; -1 / LLAMA_DEFAULT_SEED draws a random one."""
    seed = int(seed) & 0xFFFFFFFF
    if seed == DEFAULT_SEED:
        seed = secrets.randbits(32) % DEFAULT_SEED
    return seed


# -- helpers -------------------------------------------------------------------------------


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


def _keep(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """A copy of `logits` with every token outside `ids` set to -inf."""
    out = np.full_like(logits, _NEG_INF)
    out[ids] = logits[ids]
    return out


# -- float32 kernels that round as llama.cpp's C++ does ------------------------------------
# Sums run in the list's order, expf/logf are the C library's (numba calls them for float32
# math.exp/math.log), and no fastmath: so the probabilities and the draw come out bit for bit.


@exact_kernel
def _softmax_f32(x: np.ndarray, is_sorted: bool) -> np.ndarray:  # pragma: no cover - numba
    """llama_sampler_softmax_impl: float32 probabilities, the maximum taken from x[0] when
    the list is sorted."""
    m = x[0]
    if not is_sorted:
        for i in range(1, x.size):
            m = max(m, x[i])
    p = np.empty_like(x)
    s = np.float32(0.0)
    for i in range(x.size):
        e = math.exp(x[i] - m)
        p[i] = e
        s += e
    for i in range(x.size):
        p[i] = p[i] / s
    return p


@exact_kernel
def _cut(probs: np.ndarray, p: np.float32, min_keep: int, strict: bool,
         missing: int) -> int:  # pragma: no cover - numba
    """How many of `probs` to keep: up to the first whose float32 running sum reaches `p`
    (exceeds it when `strict`), and at least `min_keep`; `missing` if none does."""
    cum = np.float32(0.0)
    for i in range(probs.size):
        cum += probs[i]
        if (cum > p if strict else cum >= p) and i + 1 >= min_keep:
            return i + 1
    return missing


@exact_kernel
def _typical_scores(probs: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """|-log p - entropy| per candidate, in float32."""
    entropy = np.float32(0.0)
    for i in range(probs.size):
        entropy += -probs[i] * math.log(probs[i])
    out = np.empty_like(probs)
    for i in range(probs.size):
        out[i] = abs(-math.log(probs[i]) - entropy)
    return out


@exact_kernel
def _dist_index(x: np.ndarray, is_sorted: bool, u: float) -> int:  # pragma: no cover - numba
    """llama.cpp's dist: float32 weights expf(x - max) summed in double; the first candidate
    whose running sum reaches total * u."""
    m = x[0]
    if not is_sorted:
        for i in range(1, x.size):
            m = max(m, x[i])
    w = np.empty_like(x)
    total = 0.0
    for i in range(x.size):
        e = math.exp(x[i] - m)
        w[i] = e
        total += e
    target = total * u
    run = 0.0
    for i in range(x.size):
        run += w[i]
        if run >= target:
            return i
    return x.size - 1


# libstdc++'s sorts with comp(a, b) = a.logit > b.logit, replayed step for step on an array
# `h` of positions into the logits `x` (llama.cpp moves the elements; same moves here), so
# that tied logits end up exactly where llama.cpp's sorts leave them:
# std::partial_sort (__heap_select + __sort_heap), std::sort (introsort with a threshold
# of 16, median-of-three pivot, final insertion sort), and llama.cpp's bucket sort
# (llama_token_data_array_partial_sort) that uses them for more than 128 candidates.


@exact_kernel
def _heap_top(x: np.ndarray, k: int) -> np.ndarray:  # pragma: no cover - numba
    """Positions of the k largest of x, in the order std::partial_sort leaves them."""
    k = min(k, x.size)
    # std::partial_sort over the positions 0..n-1 reads each position past the heap once, while
    # it still holds itself: so only the heap is kept, and x[i] is read directly (same moves)
    h = np.arange(k)
    _make_heap(x, h, 0, k)
    if k > 0:
        top = x[h[0]]
        n = x.size
        for c in range(k, n, 64):  # a chunk with nothing above the heap's top changes nothing
            e = min(c + 64, n)
            hit = False
            for i in range(c, e):
                hit |= x[i] > top
            if hit:
                for i in range(c, e):
                    if x[i] > top:
                        _adjust_heap(x, h, 0, 0, k, i)
                        top = x[h[0]]
    _sort_heap(x, h, 0, k)
    return h


@exact_kernel
def _partial_sort(x: np.ndarray, h: np.ndarray, lo: int, mid: int,
                  hi: int) -> None:  # pragma: no cover - numba
    """std::partial_sort(h + lo, h + mid, h + hi)."""
    k = mid - lo
    _make_heap(x, h, lo, k)
    for i in range(mid, hi):  # __heap_select: __pop_heap(first, middle, i)
        if k > 0 and x[h[i]] > x[h[lo]]:
            v = h[i]
            h[i] = h[lo]
            _adjust_heap(x, h, lo, 0, k, v)
    _sort_heap(x, h, lo, k)


@exact_kernel
def _make_heap(x: np.ndarray, h: np.ndarray, lo: int, k: int) -> None:  # pragma: no cover - numba
    """std::__make_heap(h + lo, h + lo + k)."""
    if k >= 2:
        parent = (k - 2) // 2
        while True:
            _adjust_heap(x, h, lo, parent, k, h[lo + parent])
            if parent == 0:
                break
            parent -= 1


@exact_kernel
def _sort_heap(x: np.ndarray, h: np.ndarray, lo: int, k: int) -> None:  # pragma: no cover - numba
    """std::__sort_heap(h + lo, h + lo + k)."""
    last = k
    while last > 1:
        last -= 1
        v = h[lo + last]
        h[lo + last] = h[lo]
        _adjust_heap(x, h, lo, 0, last, v)


@exact_kernel
def _adjust_heap(x: np.ndarray, h: np.ndarray, base: int, hole: int, n: int,
                 v: int) -> None:  # pragma: no cover - numba
    """__adjust_heap then __push_heap on the heap h[base : base + n]."""
    top = hole
    child = hole
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        if x[h[base + child]] > x[h[base + child - 1]]:
            child -= 1
        h[base + hole] = h[base + child]
        hole = child
    if (n & 1) == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        h[base + hole] = h[base + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and x[h[base + parent]] > x[v]:
        h[base + hole] = h[base + parent]
        hole = parent
        parent = (hole - 1) // 2
    h[base + hole] = v


@exact_kernel
def _std_sort(x: np.ndarray, h: np.ndarray, lo: int, hi: int) -> None:  # pragma: no cover
    """std::sort(h + lo, h + hi)."""
    n = hi - lo
    if n <= 1:
        return
    depth = 0
    while (n >> (depth + 1)) > 0:  # std::__lg(n)
        depth += 1
    _introsort(x, h, lo, hi, 2 * depth)
    if n > 16:  # __final_insertion_sort
        _insertion_sort(x, h, lo, lo + 16)
        for i in range(lo + 16, hi):
            _linear_insert(x, h, i)
    else:
        _insertion_sort(x, h, lo, hi)


@exact_kernel
def _introsort(x: np.ndarray, h: np.ndarray, lo: int, hi: int,
               depth: int) -> None:  # pragma: no cover - numba
    while hi - lo > 16:
        if depth == 0:
            _partial_sort(x, h, lo, hi, hi)
            return
        depth -= 1
        # __unguarded_partition_pivot: median of (lo + 1, mid, hi - 1) moved to lo
        a, b, c = lo + 1, lo + (hi - lo) // 2, hi - 1
        if x[h[a]] > x[h[b]]:
            if x[h[b]] > x[h[c]]:
                m = b
            elif x[h[a]] > x[h[c]]:
                m = c
            else:
                m = a
        elif x[h[a]] > x[h[c]]:
            m = a
        elif x[h[b]] > x[h[c]]:
            m = c
        else:
            m = b
        h[lo], h[m] = h[m], h[lo]
        first, last = lo + 1, hi  # __unguarded_partition around h[lo]
        while True:
            while x[h[first]] > x[h[lo]]:
                first += 1
            last -= 1
            while x[h[lo]] > x[h[last]]:
                last -= 1
            if not first < last:
                break
            h[first], h[last] = h[last], h[first]
            first += 1
        _introsort(x, h, first, hi, depth)
        hi = first


@exact_kernel
def _insertion_sort(x: np.ndarray, h: np.ndarray, lo: int, hi: int) -> None:  # pragma: no cover
    for i in range(lo + 1, hi):
        if x[h[i]] > x[h[lo]]:
            v = h[i]
            for j in range(i, lo, -1):
                h[j] = h[j - 1]
            h[lo] = v
        else:
            _linear_insert(x, h, i)


@exact_kernel
def _linear_insert(x: np.ndarray, h: np.ndarray, i: int) -> None:  # pragma: no cover - numba
    v = h[i]
    j = i - 1
    while x[v] > x[h[j]]:
        h[i] = h[j]
        i = j
        j -= 1
    h[i] = v


@exact_kernel
def _bucket_sort(x: np.ndarray, k: int) -> np.ndarray:  # pragma: no cover - numba
    """llama_token_data_array_partial_sort(x, k): the positions of at least the k largest
    (whole buckets of 128 over [-10, 10]), the first k of them sorted as llama.cpp sorts."""
    n = x.size
    k = min(k, n)
    scale = np.float32(128.0 / 20.0)
    inter = np.float32(10.0) * scale
    bucket = np.empty(n, np.int64)
    histo = np.zeros(128, np.int64)
    for i in range(n):
        v = scale * x[i] + inter
        b = int(v) if v > -2147483648.0 and v < 2147483648.0 else -2147483648  # x86 cvttss2si
        b = max(0, min(127, b))
        bucket[i] = b
        histo[b] += 1
    have = 0
    ib = 127
    while ib >= 0:
        have += histo[ib]
        if have >= k:
            break
        ib -= 1
    ib = max(ib, 0)
    start = np.zeros(128, np.int64)
    pos = 0
    for j in range(127, ib - 1, -1):
        start[j] = pos
        pos += histo[j]
    res = np.empty(pos, np.int64)
    fill = start.copy()
    for i in range(n):
        if bucket[i] >= ib:
            res[fill[bucket[i]]] = i
            fill[bucket[i]] += 1
    done = 0
    for j in range(127, ib, -1):
        _std_sort(x, res, start[j], start[j] + histo[j])
        done += histo[j]
    _partial_sort(x, res, start[ib], start[ib] + k - done, start[ib] + histo[ib])
    return res


# The common chains in one call: the steps above cost ~10-50 µs each between two decodes
# (numpy calls on cold caches), ~0.2 ms a token in all; this is the same arithmetic, fused.
_FAST_GREEDY, _FAST_TOP_K = 0, 1


@exact_kernel
def _fused_chain(x: np.ndarray, saved: np.ndarray, bias_ids: np.ndarray, bias_vals: np.ndarray,
                 mode: int, k: int, top_p: np.float32, min_keep: int, min_p_on: bool,
                 log_p: np.float32, t: np.float32, ids: np.ndarray,
                 out: np.ndarray) -> int:  # pragma: no cover - numba
    """Sampler.candidates for a chain without penalties: the logit bias (add_bias, and the
    unbiased logits when it bans everything), then either the arg-max (mode _FAST_GREEDY,
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
            v = min(max(v, -_FLT_MAX), _FLT_MAX)
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
def _fused_body(x: np.ndarray, mode: int, k: int, top_p: np.float32, min_keep: int, min_p_on: bool,
                log_p: np.float32, t: np.float32, ids: np.ndarray,
                out: np.ndarray) -> int:  # pragma: no cover - numba
    """_fused_chain on the biased row."""
    if mode == _FAST_GREEDY:
        best = _heap_top(x, 1)[0]  # the first arg-max (a vectorised scan; np.argmax is not)
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
    h = _heap_top(x, k)
    n = h.size
    for i in range(n):
        ids[i] = h[i]
        out[i] = x[h[i]]
    if top_p < 1.0:
        n = _cut(_softmax_f32(out[:n], True), top_p, min_keep, False, n)
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


@exact_kernel
def _logf(x: np.float32) -> float:  # pragma: no cover - numba
    return math.log(x)


@exact_kernel
def _sigma_floor(x: np.ndarray, n: np.float32) -> np.float32:  # pragma: no cover - numba
    """max - n * std of x in float32, as llama.cpp's top-n-sigma sums: the squares in double
    (its pow(float, 2)) added to a float."""
    m = x[0]
    total = np.float32(0.0)
    valid = 0
    for i in range(x.size):
        if x[i] != -np.inf:
            m = max(m, x[i])
            total += x[i]
            valid += 1
    if valid == 0:
        return m
    count = np.float32(valid)
    mean = total / count
    acc = np.float32(0.0)
    for i in range(x.size):
        if x[i] != -np.inf:
            d = np.float64(x[i] - mean)
            acc = np.float32(np.float64(acc) + d * d)
    std = np.float32(math.sqrt(acc / count))
    return m - n * std


@exact_kernel
def _dynamic_temp(probs: np.ndarray, t: np.float32, delta: np.float32,
                  exponent: np.float32) -> np.float32:  # pragma: no cover - numba
    """temp_ext's temperature for sorted probabilities, in float32."""
    lo = max(np.float32(0.0), t - delta)
    hi = t + delta
    max_entropy = -math.log(np.float32(1.0) / np.float32(probs.size))
    entropy = np.float32(0.0)
    for i in range(probs.size):
        if probs[i] > 0.0:
            entropy -= probs[i] * math.log(probs[i])
    return lo + (hi - lo) * math.pow(entropy / max_entropy, exponent)
