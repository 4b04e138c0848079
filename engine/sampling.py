"""Token sampling: one params object, a chain of small pure functions, a seeded draw.

The chain follows llama.cpp's default order (common/sampling.cpp):

    logit bias -> penalties -> [dry] -> top_k -> typical -> top_p -> min_p -> [xtc]
    -> temperature -> dist

DRY and XTC are not implemented (both are off by default in llama.cpp). Every step takes a
full-vocabulary logits vector and returns a new one in which removed tokens are `-inf`, so a
step can be unit-tested on a hand-made vector. The steps only ever sort the tokens still
alive, so after top-k (40 by default) the later steps cost almost nothing.

`temperature <= 0` keeps only the arg-max (llama.cpp's `temp_ext` does the same), so greedy
decoding still honours logit bias and penalties. Log-probabilities reported to callers are
those of the raw logits (a plain log-softmax), as llama.cpp's server reports them by default.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# llama.cpp's LLAMA_DEFAULT_SEED: "pick a random seed". -1 on the command line wraps to it.
DEFAULT_SEED = 0xFFFFFFFF

_NEG_INF = np.float32(-np.inf)
_FLT_MAX = float(np.finfo(np.float32).max)
_TOP_P_HEAD = 1024  # top-p without top-k first tries the 1024 most likely tokens

_F32_MAX = float(np.finfo(np.float32).max)
_F32_MIN = -_F32_MAX


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling choices, with llama.cpp's defaults (common_params_sampling).

    `seed` -1 (or 0xFFFFFFFF) draws a random seed; `repeat_last_n` 0 disables the penalties
    and -1 means the whole history; `top_k` <= 0, `top_p` >= 1, `min_p` <= 0 and
    `typical_p` >= 1 disable their step; `temperature` <= 0 is greedy. `n_probs` > 0 asks for
    the log-probabilities of that many most likely tokens at each step.
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

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


# -- the chain: each step maps a logits vector (n_vocab,) to a new one ----------------------


def apply_logit_bias(logits: np.ndarray, bias: Mapping[int, float]) -> np.ndarray:
    """Add `bias[token]` to each listed token's logit (-inf bans it); ids out of range are ignored."""
    ids, values = bias_arrays(bias, logits.shape[0])
    return add_bias(logits, ids, values)


def bias_arrays(bias: Mapping[int, float], n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """A logit-bias mapping as (ids, values) arrays, ids outside the vocabulary dropped."""
    pairs = [(t, b) for t, b in bias.items() if 0 <= t < n_vocab]
    return np.array([t for t, _ in pairs], np.int64), np.array([b for _, b in pairs], np.float64)


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


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the `k` largest logits (ties at the edge go to the lower id); k <= 0 keeps all."""
    ids = top_k_ids(logits, k)
    return logits if ids.size == _alive(logits).size else _keep(logits, ids)


def apply_typical(logits: np.ndarray, p: float, min_keep: int = 0) -> np.ndarray:
    """Locally typical sampling: keep tokens whose surprise is closest to the entropy until
    their probabilities sum past `p` (llama.cpp `typical`); p >= 1 keeps all."""
    if p >= 1.0:
        return logits
    alive = _alive(logits)
    probs = _softmax(logits[alive])
    logp = np.log(np.maximum(probs, np.finfo(np.float64).tiny))
    entropy = -np.sum(probs * logp)
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    cum = np.cumsum(probs[order])
    # first i with cum[i] > p and i >= min_keep - 1
    ok = (cum > p) & (np.arange(order.size) >= min_keep - 1)
    last = int(np.argmax(ok)) + 1 if ok.any() else order.size
    return _keep(logits, alive[order[:last]])


def apply_top_p(logits: np.ndarray, p: float, min_keep: int = 0) -> np.ndarray:
    """Nucleus sampling: keep the most likely tokens until their probability reaches `p`;
    p >= 1 keeps all."""
    if p >= 1.0:
        return logits
    alive = _alive(logits)
    lse = logsumexp(logits[alive])
    if alive.size > 4 * _TOP_P_HEAD:  # sort only the head when it already holds mass p
        head = top_k_ids(logits, _TOP_P_HEAD)
        if np.sum(np.exp(logits[head] - lse)) >= p and head.size >= min_keep:
            alive = head
    order = _sorted_desc(logits, alive)
    cum = np.cumsum(np.exp(logits[order].astype(np.float64) - lse))
    # first i with cum[i] >= p and i + 1 >= min_keep
    ok = (cum >= p) & (np.arange(order.size) + 1 >= min_keep)
    last = int(np.argmax(ok)) + 1 if ok.any() else order.size
    return _keep(logits, order[:last])


def apply_min_p(logits: np.ndarray, p: float, min_keep: int = 0) -> np.ndarray:
    """Keep tokens whose probability is at least `p` times the top token's; p <= 0 keeps all."""
    if p <= 0.0:
        return logits
    alive = _alive(logits)
    if alive.size == 0:
        return logits
    x = logits[alive]
    min_logit = np.float32(x.max()) + np.float32(np.log(p))
    keep = alive[x >= min_logit]
    if keep.size < min_keep:
        keep = _sorted_desc(logits, alive)[:min_keep]
    return _keep(logits, keep)


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Divide by the temperature; temperature <= 0 keeps only the arg-max (greedy), and so does
    one that is 0 as a float32, as in llama.cpp (which holds it in a float)."""
    if np.float32(temperature) <= 0.0:
        return _keep(logits, np.array([int(np.argmax(logits))]))
    if temperature == 1.0:
        return logits
    with np.errstate(over="ignore"):
        out = logits / np.float32(temperature)
        if np.isposinf(out).any():
            # A tiny temperature: shifted first (the softmax does not see a shift), the others
            # go to -inf instead of the largest to +inf, where inf - inf would be NaN.
            out = ((logits - np.max(logits)) / np.float64(temperature)).astype(np.float32)
    return out


def sample_dist(logits: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token from softmax(logits) with one uniform number from `rng`."""
    alive = _alive(logits)
    if alive.size == 1:
        return int(alive[0])
    if alive.size == 0:  # everything banned: fall back to the arg-max like a greedy sampler
        return int(np.argmax(logits))
    cum = np.cumsum(_softmax(logits[alive]))
    i = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return int(alive[min(i, alive.size - 1)])


# -- log-probabilities of the raw logits ---------------------------------------------------


def logsumexp(logits: np.ndarray) -> float:
    """log(sum(exp(logits))): the normaliser of a plain softmax."""
    m = float(np.max(logits))
    return m + float(np.log(np.sum(np.exp(logits - np.float32(m)), dtype=np.float64)))


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
    """The chain built from one SamplingParams, with its own seeded random generator.

    Attributes:
        params: the parameters it was built from.
        seed: the seed actually used (a random one when params.seed asked for it).
    """

    def __init__(self, params: SamplingParams, eog_ids: Iterable[int] = ()):
        self.params = params
        self.seed = resolve_seed(params.seed)
        self.rng = np.random.Generator(np.random.PCG64(self.seed))
        bias = dict(params.logit_bias)
        if params.ignore_eos:  # llama.cpp bans every end-of-generation token
            bias.update({int(t): -np.inf for t in eog_ids})
        self._bias = bias
        self._bias_arrays: tuple[np.ndarray, np.ndarray] | None = None  # built for the first row

    def filter(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """Run every step but the draw.

        Returns:
            (ids, logits): the top-k candidate ids (ascending) and their final logits, -inf
            where a later step removed them. Top-k runs on the whole vocabulary; the later
            steps only see its k survivors, which gives the same result as running them on
            the full vector.
        """
        p = self.params
        x = np.asarray(logits, dtype=np.float32)
        if self._bias_arrays is None:
            self._bias_arrays = bias_arrays(self._bias, x.shape[0])
        biased = add_bias(x, *self._bias_arrays)
        # A bias that bans every token leaves nothing to draw. llama.cpp's chain never empties
        # (its bias only lowers logits to -inf) and its dist sampler then falls back to
        # whichever candidate it holds last; here the step runs as if unbiased instead.
        x = biased if np.any(biased > _NEG_INF) else x
        x = apply_penalties(
            x, history, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
        )
        if p.temperature <= 0.0 and p.typical_p >= 1.0:
            # top-k, top-p and min-p always keep the arg-max: skip them
            ids = np.array([int(np.argmax(x))])
            return ids, x[ids]
        ids = top_k_ids(x, p.top_k)
        c = x[ids]
        c = apply_typical(c, p.typical_p, p.min_keep)
        c = apply_top_p(c, p.top_p, p.min_keep)
        c = apply_min_p(c, p.min_p, p.min_keep)
        return ids, apply_temperature(c, p.temperature)

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """Pick the next token from one row of logits (n_vocab,) given the token history
        (prompt + generated so far, used by the penalties)."""
        ids, c = self.filter(logits, history)
        return int(ids[sample_dist(c, self.rng)])


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


def _sorted_desc(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """`ids` sorted by logit, highest first; ties keep ascending id."""
    return ids[np.argsort(-logits[ids], kind="stable")]


def _keep(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """A copy of `logits` with every token outside `ids` set to -inf."""
    out = np.full_like(logits, _NEG_INF)
    out[ids] = logits[ids]
    return out


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()
