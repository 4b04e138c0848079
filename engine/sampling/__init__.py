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
  `std::mt19937` seeded with the seed (std_random.py), then the first candidate whose
  running sum of unnormalised weights (float32, summed in double) reaches total * draw;
  XTC draws a float from its own generator seeded alike.

Even tied logits come out in llama.cpp's order: its sorts (std::partial_sort up to 128
candidates, its bucket sort with std::sort above, typical's std::sort) are replayed step for
step as libstdc++ runs them (std_sort.py); and banned (-inf) tokens stay in the list as in
llama.cpp's.

`temperature <= 0` keeps only the arg-max (llama.cpp's `temp_ext` does the same), so greedy
decoding still honours logit bias and penalties. Log-probabilities reported to callers are
those of the raw logits (a plain log-softmax), as llama.cpp's server reports them by default.

The modules, each importing only those listed above it:

    params.py      SamplingParams, the step names and their spellings, the seed rule
    std_random.py  std::mt19937 and libstdc++'s canonical draws
    std_sort.py    libstdc++'s std::sort and std::partial_sort, move for move
    kernels.py     llama.cpp's float32 arithmetic and sort orders, as numba kernels
    steps.py       Candidates and the steps, one function each
    fused.py       the two common chains in one kernel call
    chain.py       the name -> step table, Sampler and make_sampler
    logprobs.py    log-probabilities and post-sampling probabilities for the caller
"""

from .chain import Sampler, make_sampler, warm_up
from .logprobs import candidate_probs, logsumexp, top_k_ids, top_logprobs
from .params import (
    DEFAULT_SAMPLERS,
    DEFAULT_SEED,
    SAMPLER_CHARS,
    SamplingParams,
    active_steps,
    resolve_seed,
    sampler_names,
)
from .steps import (
    Candidates,
    add_bias,
    bias_arrays,
    candidates_of,
    dynamic_temperature,
    min_p,
    penalties,
    sample_dist,
    sort_candidates,
    temperature,
    top_k,
    top_n_sigma,
    top_p,
    typical,
    xtc,
)

__all__ = [
    "DEFAULT_SAMPLERS",
    "DEFAULT_SEED",
    "SAMPLER_CHARS",
    "Candidates",
    "Sampler",
    "SamplingParams",
    "active_steps",
    "add_bias",
    "bias_arrays",
    "candidate_probs",
    "candidates_of",
    "dynamic_temperature",
    "logsumexp",
    "make_sampler",
    "min_p",
    "penalties",
    "resolve_seed",
    "sample_dist",
    "sampler_names",
    "sort_candidates",
    "temperature",
    "top_k",
    "top_k_ids",
    "top_logprobs",
    "top_n_sigma",
    "top_p",
    "typical",
    "warm_up",
    "xtc",
]
