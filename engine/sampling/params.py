"""Sampling parameters: SamplingParams, the chain's step names and the seed rule.

The names and defaults are llama.cpp's (common/common.h `common_params_sampling`,
common/sampling.cpp `common_sampler_types_from_names`), so that a request or a command line
written for llama-server means the same here.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# llama.cpp's LLAMA_DEFAULT_SEED: "pick a random seed". -1 on the command line wraps to it.
DEFAULT_SEED = 0xFFFFFFFF
# common_params_sampling.samplers; the chain ends with dist
DEFAULT_SAMPLERS = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)
# other spellings llama.cpp's common_sampler_types_from_names accepts
_SAMPLER_ALIASES = {
    "top-k": "top_k",
    "top-p": "top_p",
    "top-n-sigma": "top_n_sigma",
    "min-p": "min_p",
    "nucleus": "top_p",
    "typical": "typ_p",
    "typical-p": "typ_p",
    "typical_p": "typ_p",
    "typ-p": "typ_p",
    "typ": "typ_p",
    "temp": "temperature",
    "topk": "top_k",
    "topp": "top_p",
    "minp": "min_p",
    "topnsigma": "top_n_sigma",
    "top-nsigma": "top_n_sigma",
}
# llama.cpp's one-letter sampler codes (common_sampler_type_to_chr), e.g. --sampling-seq "kfypmt"
SAMPLER_CHARS = {
    "d": "dry",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "s": "top_n_sigma",
    "m": "min_p",
    "t": "temperature",
    "x": "xtc",
    "i": "infill",
    "e": "penalties",
    "a": "adaptive_p",
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


def active_steps(params: SamplingParams) -> list[str]:
    """The steps of `params.samplers` that would change something, in order ("temperature"
    always, so that the list is what llama.cpp's dist sees; unknown names and "dry" dropped)."""
    p = params
    # the comparisons are in float32: llama.cpp holds these parameters in floats
    on = {
        "penalties": p.repeat_last_n != 0
        and (p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0),
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


def resolve_seed(seed: int) -> int:
    """Map a user seed to a uint32; -1 / LLAMA_DEFAULT_SEED draws a random one."""
    seed = int(seed) & 0xFFFFFFFF
    if seed == DEFAULT_SEED:
        seed = secrets.randbits(32) % DEFAULT_SEED
    return seed
