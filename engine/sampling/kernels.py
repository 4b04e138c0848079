"""llama.cpp's sampler arithmetic as numba kernels: its float32 roundings and its sort orders.

Sums run in the list's order, expf/logf are the C library's (numba calls them for float32
math.exp/math.log) and the kernels are built without fastmath (exact_kernel): so the
probabilities, the cuts and the draw come out bit for bit as llama.cpp's C++ computes them
(src/llama-sampler.cpp). The sorts are llama.cpp's: std::partial_sort up to 128 candidates,
its bucket sort above (llama_token_data_array_partial_sort), both on libstdc++'s moves
(std_sort.py).
"""

from __future__ import annotations

import math

import numpy as np

from ..jit import exact_kernel
from .std_sort import heap_top, partial_sort, std_sort

FLT_MAX = float(np.finfo(np.float32).max)
# llama.cpp sorts up to this many candidates with std::partial_sort (a heap), more by buckets
HEAP_SORT_MAX = 128


def sort_order(x: np.ndarray, k: int) -> np.ndarray:
    """llama_token_data_array_partial_sort_inplace: positions of the k largest of x, sorted,
    ties where llama.cpp leaves them (std::partial_sort up to 128, its bucket sort above)."""
    return heap_top(x, k) if k <= HEAP_SORT_MAX else bucket_sort(x, k)[:k]


# -- float32 arithmetic ------------------------------------------------------------------------


@exact_kernel
def softmax_f32(x: np.ndarray, is_sorted: bool) -> np.ndarray:  # pragma: no cover - numba
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
def keep_count(
    probs: np.ndarray, p: np.float32, min_keep: int, strict: bool, missing: int
) -> int:  # pragma: no cover - numba
    """How many of `probs` to keep: up to the first whose float32 running sum reaches `p`
    (exceeds it when `strict`), and at least `min_keep`; `missing` if none does."""
    cum = np.float32(0.0)
    for i in range(probs.size):
        cum += probs[i]
        if (cum > p if strict else cum >= p) and i + 1 >= min_keep:
            return i + 1
    return missing


@exact_kernel
def typical_scores(probs: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """|-log p - entropy| per candidate, in float32."""
    entropy = np.float32(0.0)
    for i in range(probs.size):
        entropy += -probs[i] * math.log(probs[i])
    out = np.empty_like(probs)
    for i in range(probs.size):
        out[i] = abs(-math.log(probs[i]) - entropy)
    return out


@exact_kernel
def dist_index(x: np.ndarray, is_sorted: bool, u: float) -> int:  # pragma: no cover - numba
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


@exact_kernel
def logf(x: np.float32) -> float:  # pragma: no cover - numba
    """The C library's logf (min-p's threshold is logf(p))."""
    return math.log(x)


@exact_kernel
def sigma_floor(x: np.ndarray, n: np.float32) -> np.float32:  # pragma: no cover - numba
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
def dynamic_temp(
    probs: np.ndarray, t: np.float32, delta: np.float32, exponent: np.float32
) -> np.float32:  # pragma: no cover - numba
    """temp_ext's temperature for sorted probabilities, in float32."""
    lo = max(np.float32(0.0), t - delta)
    hi = t + delta
    max_entropy = -math.log(np.float32(1.0) / np.float32(probs.size))
    entropy = np.float32(0.0)
    for i in range(probs.size):
        if probs[i] > 0.0:
            entropy -= probs[i] * math.log(probs[i])
    return lo + (hi - lo) * math.pow(entropy / max_entropy, exponent)


# -- llama.cpp's bucket sort -------------------------------------------------------------------


@exact_kernel
def bucket_sort(x: np.ndarray, k: int) -> np.ndarray:  # pragma: no cover - numba
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
        std_sort(x, res, start[j], start[j] + histo[j])
        done += histo[j]
    partial_sort(x, res, start[ib], start[ib] + k - done, start[ib] + histo[ib])
    return res
