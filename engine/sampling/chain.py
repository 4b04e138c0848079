"""The sampler: the chain of steps one SamplingParams asks for, and its seeded draw.

The chain is a table from llama.cpp's sampler names to the steps (steps.py), each bound to
the request's parameters (as mlx-lm's make_sampler binds its apply_* functions): the active
names, in `params.samplers` order, pick the steps, and `dist` draws from what is left. The
two chains nearly every request runs go through one fused kernel instead (fused.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .fused import FusedChain
from .kernels import bucket_sort
from .params import SamplingParams, active_steps, resolve_seed
from .std_random import StdMt19937
from .steps import (
    Candidates,
    add_bias,
    bias_arrays,
    candidates_of,
    dynamic_temperature,
    min_p,
    penalties,
    sample_dist,
    top_k,
    top_n_sigma,
    top_p,
    typical,
    xtc,
)

_NEG_INF = np.float32(-np.inf)

# one step of a bound chain: (candidates, token history) -> candidates
Step = Callable[[Candidates, Sequence[int]], Candidates]


def chain_steps(p: SamplingParams, xtc_rng: StdMt19937) -> dict[str, Step]:
    """Every step by llama.cpp's sampler name, bound to `p` (XTC draws from `xtc_rng`)."""
    return {
        "penalties": lambda c, history: penalties(
            c, history, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
        ),
        "top_n_sigma": lambda c, _: top_n_sigma(c, p.top_n_sigma),
        "top_k": lambda c, _: top_k(c, p.top_k),
        "typ_p": lambda c, _: typical(c, p.typical_p, p.min_keep),
        "top_p": lambda c, _: top_p(c, p.top_p, p.min_keep),
        "min_p": lambda c, _: min_p(c, p.min_p, p.min_keep),
        "xtc": lambda c, _: xtc(c, p.xtc_probability, p.xtc_threshold, p.min_keep, xtc_rng),
        "temperature": lambda c, _: dynamic_temperature(
            c, p.temperature, p.dynatemp_range, p.dynatemp_exponent
        ),
    }


class Sampler:
    """The chain built from one SamplingParams, with its own std::mt19937.

    Attributes:
        params: the parameters it was built from.
        seed: the seed actually used (a random one when params.seed asked for it).
        last_candidates: what the last draw chose from (llama-server's post_sampling_probs).
        fused: the chain's fused form (fused.py); None where it runs step by step.
    """

    def __init__(self, params: SamplingParams, eog_ids: Iterable[int] = ()):
        self.params = params
        self.seed = resolve_seed(params.seed)
        self.rng = StdMt19937(self.seed)
        xtc_rng = StdMt19937(self.seed)  # llama.cpp's XTC seeds its own generator
        bias = dict(params.logit_bias)
        if params.ignore_eos:  # llama.cpp bans every end-of-generation token
            bias.update({int(t): -np.inf for t in eog_ids})
        self._bias = bias
        self._bias_arrays: tuple[np.ndarray, np.ndarray] | None = None  # built for the first row
        self.last_candidates: Candidates | None = None
        self._steps = active_steps(params)
        table = chain_steps(params, xtc_rng)
        self._chain = [table[name] for name in self._steps]
        # Greedy: top-n-sigma, top-k, top-p and min-p keep the arg-max, then temperature keeps
        # only it. Typical and XTC can drop it, and penalties change it unless they come first.
        self._argmax_only = (
            np.float32(params.temperature) <= 0.0
            and np.float32(params.dynatemp_range) <= 0.0
            and "temperature" in self._steps
            and not {"typ_p", "xtc"} & set(self._steps)
            and "penalties" not in self._steps[1:]
        )
        self.fused = FusedChain.of(params, self._steps, self._argmax_only)

    def candidates(self, logits: np.ndarray, history: Sequence[int] = ()) -> Candidates:
        """Run every step but the draw: the candidates `dist` draws from, in llama.cpp's order."""
        x = np.asarray(logits, dtype=np.float32)
        if self._bias_arrays is None:
            self._bias_arrays = bias_arrays(self._bias, x.shape[0])
        if self.fused is not None:
            fused = self.fused.candidates(x, *self._bias_arrays)
            if fused is not None:
                return fused
        biased = add_bias(x, *self._bias_arrays)
        # A bias that bans every token leaves nothing to draw. llama.cpp's chain never empties
        # (its bias only lowers logits to -inf) and its dist sampler then falls back to
        # whichever candidate it holds last; here the step runs as if unbiased instead.
        if biased is not x and np.any(biased > _NEG_INF):
            x = biased
        c, chain = candidates_of(x), self._chain
        if self._argmax_only:
            if self._steps[0] == "penalties":  # (the only place they can be here)
                c, chain = chain[0](c, history), chain[1:]
            i = int(np.argmax(c.logits))
            if np.count_nonzero(c.logits == c.logits[i]) == 1:  # else the chain's order picks
                return Candidates(np.array([i]), c.logits[i : i + 1], True)
        for step in chain:
            c = step(c, history)
        return c

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """Pick the next token from one row of logits (n_vocab,) given the token history
        (prompt + generated so far, used by the penalties)."""
        c = self.last_candidates = self.candidates(logits, history)
        if c.size == 0:  # every token -inf: fall back to the arg-max like a greedy sampler
            self.rng.canonical()
            return int(np.argmax(logits))
        return sample_dist(c, self.rng)


def make_sampler(params: SamplingParams, eog_ids: Iterable[int] = ()) -> Sampler:
    """Build the sampler chain for `params`; `eog_ids` are banned when params.ignore_eos."""
    return Sampler(params, eog_ids)


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
    bucket_sort(x, 2)  # top-k above 128 and long lists
