"""libstdc++'s sorts, replayed step for step: where they leave tied elements is part of the result.

llama.cpp sorts its candidates (and ggml_argsort its expert scores) with std::partial_sort
and std::sort, which are not stable: tied logits end up where libstdc++'s moves leave them, and
that order decides which tied token top-k keeps and which one a draw lands on. These kernels
make the same moves on an array `h` of positions into the values `x`, with comp(a, b) =
x[a] > x[b] (highest first), so that ties come out exactly as in llama.cpp. The C++ standard
library's random numbers are replayed beside them, in std_random.py.
"""

from __future__ import annotations

import numpy as np

from ..jit import exact_kernel

# llama.cpp moves the elements; the same moves here on their positions. std::partial_sort is
# __heap_select + __sort_heap; std::sort is introsort (threshold 16, median-of-three pivot)
# followed by a final insertion sort.


@exact_kernel
def heap_top(x: np.ndarray, k: int) -> np.ndarray:  # pragma: no cover - numba
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
def partial_sort(
    x: np.ndarray, h: np.ndarray, lo: int, mid: int, hi: int
) -> None:  # pragma: no cover - numba
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
def _adjust_heap(
    x: np.ndarray, h: np.ndarray, base: int, hole: int, n: int, v: int
) -> None:  # pragma: no cover - numba
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
def std_sort(x: np.ndarray, h: np.ndarray, lo: int, hi: int) -> None:  # pragma: no cover
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
def _introsort(
    x: np.ndarray, h: np.ndarray, lo: int, hi: int, depth: int
) -> None:  # pragma: no cover - numba
    while hi - lo > 16:
        if depth == 0:
            partial_sort(x, h, lo, hi, hi)
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
