"""KVCache: keys and values of every layer, allocated once; the cells each sequence owns.

Layout per layer: (n_stream, n_cells, n_head_kv, head_dim), as llama.cpp's streams.
- Split cache (default): one stream per sequence of n_ctx / n_seq_max cells; sequence s is
  stream s, its position p cell p.
- Unified cache (-kvu, n_seq_max > 1): ONE stream of n_ctx cells shared by every sequence.
  Each sequence owns a contiguous run of cells [base, base + cap) of it, position p at cell
  base + p, so kernels still see a sequence as contiguous positions 0..len-1 (a C-contiguous
  view, no gather). Runs grow on demand (`reserve`, before the forward pass writes), move to
  a free run when their neighbour is in the way, and the pool is compacted when only the sum
  of the free cells is large enough. When even that is too small, `KVCacheFullError`: the
  scheduler frees idle sequences or fails the requests, as llama-server does.

f16 caches hold float16 bit patterns in uint16 arrays (numba converts them in blocks,
ops._f16_block). Nothing grows later: memory is n_ctx cells in both layouts.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from .config import ModelConfig
from .errors import EngineError, KVCacheFullError

CACHE_TYPES = {"f16": np.uint16, "f32": np.float32}
GROW_CELLS = 32  # a unified sequence's run grows by at least this, so decode rarely moves it


def cache_dtype(name: str) -> np.dtype:
    if name not in CACHE_TYPES:
        raise EngineError(
            f"unsupported KV cache type '{name}' (supported: {', '.join(CACHE_TYPES)})"
        )
    return np.dtype(CACHE_TYPES[name])


def _zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed array on its own anonymous mapping: pages become resident only once written
    and go back to the OS when the cache is freed. (np.zeros gets an arena's freed memory
    after a server's sleep/wake cycle, and calloc then zeroes -- touches -- all of it.)"""
    n = int(np.prod(shape)) * dtype.itemsize
    if n < 1 << 20:
        return np.zeros(shape, dtype)
    try:
        return np.frombuffer(mmap.mmap(-1, n), dtype).reshape(shape)
    except OSError as e:  # as numpy reports a refused allocation
        raise MemoryError(f"cannot map {n} bytes: {e}") from None


def kv_bytes(cfg: ModelConfig, n_cells: int, n_stream: int, type_k: str, type_v: str) -> int:
    """Bytes the cache allocates for n_stream streams of n_cells; the same formula serves the
    estimate before loading (split: n_ctx_seq x n_seq_max, unified: n_ctx x 1)."""
    per_pos = cfg.n_head_kv * (
        cfg.head_dim * cache_dtype(type_k).itemsize + cfg.head_dim_v * cache_dtype(type_v).itemsize
    )
    return cfg.n_layer * n_stream * n_cells * per_pos


class DeviceKV(Protocol):
    """The keys and values of the layers a GPU runs (engine/backends/gl/offload.py): the cache
    keeps their bookkeeping and reaches their data through read/write, which take and give
    the host arrays' layout and dtype, (cells, n_head_kv, head_dim) of one stream."""

    layers: frozenset[int]

    @property
    def nbytes(self) -> int: ...

    def read(self, il: int, kind: str, stream: int, c0: int, c1: int) -> np.ndarray: ...

    def write(self, il: int, kind: str, stream: int, c0: int, data: np.ndarray) -> None: ...


class KVCache:
    """Args:
    n_ctx_seq: positions one sequence may use (unified: the whole pool, n_ctx).
    n_seq_max: sequences.
    unified: one pool of n_ctx_seq cells shared by all sequences, instead of n_ctx_seq
        cells for each.
    device: where the layers a GPU runs keep their keys and values; their host arrays
        have no cells.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        n_ctx_seq: int,
        n_seq_max: int,
        type_k: str = "f16",
        type_v: str = "f16",
        unified: bool = False,
        device: DeviceKV | None = None,
    ):
        self.cfg = cfg
        self.n_ctx_seq = n_ctx_seq
        self.n_seq_max = n_seq_max
        self.unified = unified and n_seq_max > 1
        self.type_k, self.type_v = type_k, type_v
        dk, dv = cache_dtype(type_k), cache_dtype(type_v)
        G = cfg.n_head_kv
        n_stream = 1 if self.unified else n_seq_max
        self.n_cells = n_ctx_seq  # per stream
        self.device = device
        on_host = [device is None or il not in device.layers for il in range(cfg.n_layer)]
        # k[il], v[il]: (n_stream, n_cells, n_head_kv, head_dim); no cells for a GPU's layers
        self.k = [_zeros((n_stream, n_ctx_seq if h else 0, G, cfg.head_dim), dk) for h in on_host]
        self.v = [_zeros((n_stream, n_ctx_seq if h else 0, G, cfg.head_dim_v), dv) for h in on_host]
        self._bytes_per_pos = kv_bytes(cfg, 1, 1, type_k, type_v)
        self._len = np.zeros(n_seq_max, np.int64)
        # where each sequence's cells are: stream, first cell, cells reserved
        self._stream = np.zeros(n_seq_max, np.int64) if self.unified else np.arange(n_seq_max)
        self._base = np.zeros(n_seq_max, np.int64)
        self._cap = np.zeros(n_seq_max, np.int64) if self.unified else np.full(n_seq_max, n_ctx_seq)
        self._held = np.zeros(n_seq_max, np.int64)  # cells a batch being reserved needs kept
        # How each layer's keys are rotated and how far back its queries see: fixed for the
        # life of the cache (LongRoPE's factors depend on n_ctx_seq), shared by the forward
        # pass and the context shift.
        self.rope = [cfg.layer_rope(il, n_ctx_seq) for il in range(cfg.n_layer)]
        self.window = [cfg.layer_window(il) for il in range(cfg.n_layer)]

    # bookkeeping ---------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes of keys and values on every device (host_nbytes + the GPU's)."""
        return self.host_nbytes + (self.device.nbytes if self.device is not None else 0)

    @property
    def host_nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    @property
    def bytes_per_pos(self) -> int:
        return self._bytes_per_pos

    def token_cells(self, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(stream, cell of position 0) of each token's sequence: position p of token t's
        sequence is cell base[t] + p of row stream[t] of a layer's k and v (split cache: the
        sequence's own stream from cell 0; unified: the one stream, from the sequence's run).
        One attention call then serves the decode tokens of every sequence, on the CPU and a
        GPU. The same for every layer of a ubatch once its cells are reserved."""
        return self._stream[seq], self._base[seq]

    def _read(self, il: int, kind: str, st: int, c0: int, c1: int) -> np.ndarray:
        """A copy of cells [c0, c1) of stream st of layer il's keys ("k") or values ("v")."""
        if self.device is not None and il in self.device.layers:
            return self.device.read(il, kind, st, c0, c1)
        return (self.k if kind == "k" else self.v)[il][st, c0:c1].copy()

    def _write(self, il: int, kind: str, st: int, c0: int, data: np.ndarray) -> None:
        if self.device is not None and il in self.device.layers:
            self.device.write(il, kind, st, c0, data)
        else:
            (self.k if kind == "k" else self.v)[il][st, c0 : c0 + len(data)] = data

    def _all(self) -> Iterator[tuple[int, str]]:
        for kind in ("k", "v"):
            for il in range(len(self.k)):
                yield il, kind

    def used_bytes(self, seq: int | None = None) -> int:
        n = int(self._len.sum()) if seq is None else int(self._len[seq])
        return n * self.bytes_per_pos

    def n_cells_free(self) -> int:
        """Cells no sequence holds (unified: of the shared pool; split: of every stream)."""
        total = self.n_cells * (1 if self.unified else self.n_seq_max)
        return total - int(self._len.sum())

    def seq_len(self, seq: int) -> int:
        self._check_seq(seq)
        return int(self._len[seq])

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.n_seq_max:
            raise EngineError(f"sequence id {seq} out of range [0, {self.n_seq_max})")

    def _run(self, seq: int, p0: int, p1: int) -> tuple[int, slice]:
        """(stream, cell slice) of positions [p0, p1) of seq."""
        b = int(self._base[seq])
        return int(self._stream[seq]), slice(b + p0, b + p1)

    # cells of the unified pool ---------------------------------------------------------------
    def reserve_batch(self, needs: dict[int, int]) -> None:
        """reserve() for every sequence of a batch: seq -> positions it will hold. All or
        nothing for the batch (a later sequence's compaction keeps what earlier ones got)."""
        try:
            for seq, n_pos in needs.items():
                self.reserve(seq, n_pos)
                self._held[seq] = n_pos
        finally:
            self._held[:] = 0

    def reserve(self, seq: int, n_pos: int) -> None:
        """Make room for positions 0..n_pos-1 of seq (before the forward pass stores them).

        Raises:
            KVCacheFullError: the pool has fewer free cells than the sequence needs.
            ContextOverflowError is the caller's check (n_pos > n_ctx_seq) in a split cache.
        """
        self._check_seq(seq)
        if n_pos <= self._cap[seq]:
            return
        if not self.unified:
            raise KVCacheFullError(
                f"sequence {seq}: {n_pos} positions exceed its {self.n_cells} cells"
            )
        n_len = int(self._len[seq])
        others = [s for s in range(self.n_seq_max) if s != seq and self._cap[s] > 0]
        free_after_compaction = self.n_cells - sum(self._kept(s) for s in others)
        if n_pos > free_after_compaction:
            raise KVCacheFullError(
                f"the unified KV cache is full: sequence {seq} needs {n_pos} cells, "
                f"{free_after_compaction} are not held by other sequences"
            )
        want = min(max(n_pos, -(-n_pos // GROW_CELLS) * GROW_CELLS), free_after_compaction)
        runs = self._free_runs(others)
        if self._cap[seq] > 0:  # grow in place when the run after it is free
            b = int(self._base[seq])
            for r0, r1 in runs:
                if r0 <= b < r1 and r1 - b >= n_pos:
                    self._cap[seq] = min(want, r1 - b)
                    return
        fits = [(r0, r1) for r0, r1 in runs if r1 - r0 >= n_pos]
        if fits:
            r0, r1 = max(fits, key=lambda r: r[1] - r[0])
            cap = min(want, r1 - r0)
            # leave the free cells after a neighbour's run to that neighbour, half of them
            neighbour = any(int(self._base[s] + self._cap[s]) == r0 for s in others)
            new_base = r0 + ((r1 - r0 - cap) // 2 if neighbour else 0)
            self._move(seq, new_base, n_len)
            self._cap[seq] = cap
            return
        self._compact(seq, others, n_pos)

    def _kept(self, s: int) -> int:
        """Cells of s a compaction keeps: its positions, or more if the batch needs them."""
        return max(int(self._len[s]), int(self._held[s]))

    def _free_runs(self, others: list[int]) -> list[tuple[int, int]]:
        """Free [start, end) runs of the pool around the runs of `others`, in cell order."""
        taken = sorted((int(self._base[s]), int(self._base[s] + self._cap[s])) for s in others)
        runs, at = [], 0
        for b, e in taken:
            if b > at:
                runs.append((at, b))
            at = max(at, e)
        if at < self.n_cells:
            runs.append((at, self.n_cells))
        return runs

    def _move(self, seq: int, new_base: int, n: int) -> None:
        old = int(self._base[seq])
        if n and new_base != old:
            for il, kind in self._all():  # a copy first: the ranges may overlap
                self._write(il, kind, 0, new_base, self._read(il, kind, 0, old, old + n))
        self._base[seq] = new_base

    def _compact(self, seq: int, others: list[int], n_pos: int) -> None:
        """Pack every sequence's cells at the start of the pool, seq's last, sharing the spare
        cells out as growing room (up to GROW_CELLS each): the only moves that free a large
        run, done rarely."""
        n = int(self._len[seq])
        b = int(self._base[seq])
        saved = [self._read(il, kind, 0, b, b + n) for il, kind in self._all()]
        spare = self.n_cells - n_pos - sum(self._kept(s) for s in others)
        room = min(GROW_CELLS, spare // (len(others) + 1))
        at = 0
        for s in sorted(others, key=lambda s: int(self._base[s])):
            self._move(s, at, int(self._len[s]))
            self._cap[s] = self._kept(s) + room
            at += int(self._cap[s])
        self._base[seq] = at
        for (il, kind), data in zip(self._all(), saved, strict=True):
            self._write(il, kind, 0, at, data)
        self._cap[seq] = self.n_cells - at

    def _release(self, seq: int) -> None:
        if self.unified:  # an empty sequence holds no cells of the pool
            self._cap[seq] = 0
            self._base[seq] = 0

    # writes from the forward pass ----------------------------------------------------------
    def commit(self, seq: int, n_pos: int) -> None:
        self._len[seq] = n_pos

    def store(
        self, il: int, seq: np.ndarray, pos: np.ndarray, k: np.ndarray, v: np.ndarray
    ) -> None:
        """k (T, G, D), v (T, G, Dv) float32 for tokens at (seq[t], pos[t]); the cells must be
        reserved (see reserve)."""
        kc, vc = self.k[il], self.v[il]
        stream, cell = (self._stream[seq], self._base[seq] + pos) if self.unified else (seq, pos)
        if kc.dtype == np.uint16:
            kc[stream, cell] = k.astype(np.float16).view(np.uint16)
        else:
            kc[stream, cell] = k
        if vc.dtype == np.uint16:
            vc[stream, cell] = v.astype(np.float16).view(np.uint16)
        else:
            vc[stream, cell] = v

    def read_f32(self, il: int, seq: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of positions 0..n-1 of `seq` as float32 (L, G, D) copies."""
        st, cells = self._run(seq, 0, n)
        k, v = self.k[il][st, cells], self.v[il][st, cells]
        if k.dtype == np.uint16:
            k = k.view(np.float16).astype(np.float32)
        if v.dtype == np.uint16:
            v = v.view(np.float16).astype(np.float32)
        return k, v

    # whole-sequence state (slot save / restore) ----------------------------------------------
    def seq_state(self, seq: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Copies of every layer's keys and values of seq's positions (slot files)."""
        n = self.seq_len(seq)
        st, cells = self._run(seq, 0, n)
        return (
            [self._read(il, "k", st, cells.start, cells.stop) for il in range(len(self.k))],
            [self._read(il, "v", st, cells.start, cells.stop) for il in range(len(self.v))],
        )

    def set_seq_state(self, seq: int, k: list[np.ndarray], v: list[np.ndarray]) -> None:
        """Replace seq's cache by these keys and values (shapes and types as seq_state's).

        Raises:
            EngineError: shapes or types that are not this cache's.
            KVCacheFullError: no room for them.
        """
        self._check_seq(seq)
        if len(k) != len(self.k) or len(v) != len(self.v):
            raise EngineError(f"state has {len(k)} layers, the model {len(self.k)}")
        n = int(k[0].shape[0]) if k else 0
        for a, c in zip((*k, *v), (*self.k, *self.v), strict=True):
            if a.shape != (n, *c.shape[2:]) or a.dtype != c.dtype:
                raise EngineError(
                    f"state shape {a.shape} {a.dtype} does not match the cache's "
                    f"(n, {', '.join(map(str, c.shape[2:]))}) {c.dtype}"
                )
        if n > self.n_ctx_seq:
            raise KVCacheFullError(
                f"{n} positions do not fit in the {self.n_ctx_seq} of a sequence"
            )
        self.seq_clear(seq)
        self.reserve(seq, n)
        st, cells = self._run(seq, 0, n)
        for (il, kind), a in zip(self._all(), (*k, *v), strict=True):
            self._write(il, kind, st, cells.start, a)
        self._len[seq] = n

    # sequence operations (llama_memory_seq_*) ----------------------------------------------
    def seq_clear(self, seq: int) -> None:
        self._check_seq(seq)
        self._len[seq] = 0
        self._release(seq)

    def clear(self) -> None:
        self._len[:] = 0
        for s in range(self.n_seq_max):
            self._release(s)

    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> None:
        """Remove positions [p0, p1) (p1 < 0: to the end). Removing from the middle shifts the
        later positions down (as seq_rm followed by seq_add would)."""
        self._check_seq(seq)
        n = int(self._len[seq])
        p0 = max(0, p0)
        p1 = n if p1 < 0 or p1 > n else p1
        if p0 >= p1:
            return
        if p1 == n:
            self._len[seq] = p0
            if p0 == 0:
                self._release(seq)
        else:
            self.seq_shift_discard(seq, p0, p1 - p0)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Copy positions [p0, p1) of src into dst (dst then holds src's prefix up to p1)."""
        self._check_seq(src)
        self._check_seq(dst)
        n = int(self._len[src])
        p1 = n if p1 < 0 or p1 > n else p1
        if src == dst or p1 <= 0:
            return
        if p0 > int(self._len[dst]):
            raise EngineError(f"seq_cp: destination sequence {dst} has a gap before position {p0}")
        self.reserve(dst, p1)
        (s_st, s_cells), (d_st, d_cells) = self._run(src, p0, p1), self._run(dst, p0, p1)
        for il, kind in self._all():
            self._write(
                il,
                kind,
                d_st,
                d_cells.start,
                self._read(il, kind, s_st, s_cells.start, s_cells.stop),
            )
        self._len[dst] = p1

    def seq_shift_discard(self, seq: int, p0: int, n_discard: int) -> None:
        """Drop positions [p0, p0+n_discard) and move the later ones down, re-roping the keys
        by -n_discard so they carry their new positions (llama.cpp's context shift)."""
        from .ops import rope

        self._check_seq(seq)
        n = int(self._len[seq])
        if n_discard <= 0 or p0 >= n:
            return
        n_discard = min(n_discard, n - p0)
        src0, cnt = p0 + n_discard, n - p0 - n_discard
        st, b = int(self._stream[seq]), int(self._base[seq])
        for il in range(self.cfg.n_layer):
            if cnt:
                kk = self._read(il, "k", st, b + src0, b + src0 + cnt)
                f16 = kk.dtype == np.uint16
                kf = kk.view(np.float16).astype(np.float32) if f16 else kk
                # Rotating by -delta undoes delta positions of RoPE (rotations compose); a pure
                # rotation, without the attention factor the keys already carry.
                delta = np.full(cnt, -n_discard, np.int32)
                rope(kf, delta, self.rope[il].inv_freq, self.rope[il].neox)
                self._write(
                    il, "k", st, b + p0, kf.astype(np.float16).view(np.uint16) if f16 else kf
                )
                self._write(il, "v", st, b + p0, self._read(il, "v", st, b + src0, b + src0 + cnt))
        self._len[seq] = n - n_discard
