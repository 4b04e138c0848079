"""Pooling and normalisation of final hidden states into embeddings (llama.cpp's rules)."""

from __future__ import annotations

import numpy as np

from .errors import InvalidRequestError

POOLING_TYPES = ("none", "mean", "cls", "last")


def pool_embeddings(rows: np.ndarray, pooling: str, normalize: int) -> np.ndarray:
    """rows: (n_tokens, n_embd) hidden states of one prompt -> pooled vector(s)."""
    if pooling == "mean":
        out = rows.mean(axis=0)
    elif pooling == "cls":
        out = rows[0]
    elif pooling == "last":
        out = rows[-1]
    elif pooling == "none":
        return np.stack([normalize_embedding(r, normalize) for r in rows])
    else:
        raise InvalidRequestError(
            f"unknown pooling type {pooling!r}; expected one of {POOLING_TYPES}"
        )
    return normalize_embedding(out, normalize)


def normalize_embedding(v: np.ndarray, norm: int) -> np.ndarray:
    """llama.cpp common_embd_normalize: -1 none, 0 max-abs to int16 range, 2 L2, else p-norm."""
    v = np.asarray(v, dtype=np.float32)
    if norm < 0:
        return v
    if norm == 0:
        s = float(np.abs(v).max() / 32760.0)
    elif norm == 2:
        s = float(np.sqrt(np.sum(v.astype(np.float64) ** 2)))
    else:
        s = float(np.sum(np.abs(v.astype(np.float64)) ** norm) ** (1.0 / norm))
    return v / s if s > 0 else v
