"""Slow oracles: gguf-py's dequantize plus numpy. Used by tests and as a last-resort fallback."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as _gguf_dequantize


def dequant_ref(raw: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """raw (n_rows, row_bytes) uint8 or typed dense rows -> (n_rows, n_cols) float32."""
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return np.asarray(raw, dtype=np.float32)
    if qtype == GGMLQuantizationType.BF16:
        raw = np.ascontiguousarray(raw).view(np.uint16)
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(_gguf_dequantize(np.ascontiguousarray(raw), qtype), dtype=np.float32)
