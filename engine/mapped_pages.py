"""The pages of a mapped file this process holds: letting them go once a copy replaces them.

Below the GGUF reader (gguf_file.py) and the quants (base.py, _kern.py) that call it.
"""

from __future__ import annotations

import mmap

import numpy as np


def release_mapped_pages(a: np.ndarray) -> int:
    """Drop from this process the resident pages of `a`, a read-only view of a mapped file (a
    weight whose interleaved copy was made): the kernel reads them back from the file should anything
    touch them again. Returns the bytes released; 0 when `a` is not a view of a file mapping
    (an array in RAM would lose its contents) or the OS offers no madvise."""
    base: object = a
    while isinstance(base, np.ndarray):
        base = base.base
    if not isinstance(base, mmap.mmap) or a.flags.writeable or not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    page = mmap.PAGESIZE
    start = np.frombuffer(base, np.uint8).ctypes.data
    lo = a.ctypes.data - start
    hi = lo + a.nbytes  # a's rows are contiguous (a QTensor's raw)
    lo, hi = -(-lo // page) * page, hi // page * page  # whole pages of a's own, none shared
    if hi <= lo:
        return 0
    try:
        base.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    except (OSError, ValueError):
        return 0
    return hi - lo
