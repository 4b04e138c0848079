"""KVCache: keys and values of every layer, allocated once for n_seq_max sequences.

Layout per layer: (n_seq_max, n_ctx_seq, n_head_kv, head_dim), slot index = token position,
so a sequence's cache is always the contiguous positions 0..seq_len-1. f16 caches hold float16
bit patterns in uint16 arrays (numba converts them in blocks, ops._f16_block). Nothing grows later.
"""

from __future__ import annotations

import numpy as np

from .config import ModelConfig
from .errors import EngineError

CACHE_TYPES = {"f16": np.uint16, "f32": np.float32}


def cache_dtype(name: str) -> np.dtype:
    if name not in CACHE_TYPES:
        raise EngineError(f"unsupported KV cache type '{name}' (supported: {', '.join(CACHE_TYPES)})")
    return np.dtype(CACHE_TYPES[name])


def kv_bytes(cfg: ModelConfig, n_ctx_seq: int, n_seq_max: int, type_k: str, type_v: str) -> int:
    """Bytes the cache allocates; the same formula serves the estimate before loading."""
    per_pos = cfg.n_head_kv * (
        cfg.head_dim * cache_dtype(type_k).itemsize + cfg.head_dim_v * cache_dtype(type_v).itemsize
    )
    return cfg.n_layer * n_seq_max * n_ctx_seq * per_pos


class KVCache:
    def __init__(self, cfg: ModelConfig, n_ctx_seq: int, n_seq_max: int, type_k: str = "f16", type_v: str = "f16"):
        self.cfg = cfg
        self.n_ctx_seq = n_ctx_seq
        self.n_seq_max = n_seq_max
        self.type_k, self.type_v = type_k, type_v
        dk, dv = cache_dtype(type_k), cache_dtype(type_v)
        G = cfg.n_head_kv
        # k[il], v[il]: (n_seq_max, n_ctx_seq, n_head_kv, head_dim)
        self.k = [np.zeros((n_seq_max, n_ctx_seq, G, cfg.head_dim), dk) for _ in range(cfg.n_layer)]
        self.v = [np.zeros((n_seq_max, n_ctx_seq, G, cfg.head_dim_v), dv) for _ in range(cfg.n_layer)]
        self._len = np.zeros(n_seq_max, np.int64)
        # How each layer's keys are rotated and how far back its queries see: fixed for the
        # life of the cache (LongRoPE's factors depend on n_ctx_seq), shared by the forward
        # pass and the context shift.
        self.rope = [cfg.layer_rope(il, n_ctx_seq) for il in range(cfg.n_layer)]
        self.window = [cfg.layer_window(il) for il in range(cfg.n_layer)]

    # bookkeeping ---------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    @property
    def bytes_per_pos(self) -> int:
        return self.nbytes // (self.n_seq_max * self.n_ctx_seq)

    def used_bytes(self, seq: int | None = None) -> int:
        n = int(self._len.sum()) if seq is None else int(self._len[seq])
        return n * self.bytes_per_pos

    def seq_len(self, seq: int) -> int:
        self._check_seq(seq)
        return int(self._len[seq])

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.n_seq_max:
            raise EngineError(f"sequence id {seq} out of range [0, {self.n_seq_max})")

    # writes from the forward pass ----------------------------------------------------------
    def commit(self, seq: int, n_pos: int) -> None:
        self._len[seq] = n_pos

    def store(self, il: int, seq: np.ndarray, pos: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """k (T, G, D), v (T, G, Dv) float32 for tokens at (seq[t], pos[t])."""
        kc, vc = self.k[il], self.v[il]
        if kc.dtype == np.uint16:
            kc[seq, pos] = k.astype(np.float16).view(np.uint16)
        else:
            kc[seq, pos] = k
        if vc.dtype == np.uint16:
            vc[seq, pos] = v.astype(np.float16).view(np.uint16)
        else:
            vc[seq, pos] = v

    def read_f32(self, il: int, seq: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of positions 0..n-1 of `seq` as float32 (L, G, D) copies."""
        k, v = self.k[il][seq, :n], self.v[il][seq, :n]
        if k.dtype == np.uint16:
            k = k.view(np.float16).astype(np.float32)
        if v.dtype == np.uint16:
            v = v.view(np.float16).astype(np.float32)
        return k, v

    # sequence operations (llama_memory_seq_*) ----------------------------------------------
    def seq_clear(self, seq: int) -> None:
        self._check_seq(seq)
        self._len[seq] = 0

    def clear(self) -> None:
        self._len[:] = 0

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
        for arr in (*self.k, *self.v):
            arr[dst, p0:p1] = arr[src, p0:p1]
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
        for il in range(self.cfg.n_layer):
            k, v = self.k[il], self.v[il]
            if cnt:
                kk = k[seq, src0 : src0 + cnt]
                kf = kk.view(np.float16).astype(np.float32) if k.dtype == np.uint16 else kk.copy()
                # Rotating by -delta undoes delta positions of RoPE (rotations compose); a pure
                # rotation, without the attention factor the keys already carry.
                delta = np.full(cnt, -n_discard, np.int32)
                rope(kf, delta, self.rope[il].inv_freq, self.rope[il].neox)
                k[seq, p0 : p0 + cnt] = kf.astype(np.float16).view(np.uint16) if k.dtype == np.uint16 else kf
                v[seq, p0 : p0 + cnt] = v[seq, src0 : src0 + cnt].copy()
        self._len[seq] = n - n_discard
