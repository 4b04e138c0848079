"""Compile (first start) or load from numba's cache (later starts) every kernel a model uses,
on tiny inputs, so the first request does not pay for compilation; logs when it compiles."""

from __future__ import annotations

import logging
import time

import numpy as np

from . import ops
from .quants import warmup as warmup_quant

log = logging.getLogger("ggstation.engine")


def warmup(model) -> float:
    t0 = time.perf_counter()
    seen = set()
    for t in _all_weights(model.weights):
        if t.qtype in seen:
            continue
        seen.add(t.qtype)
        warmup_quant(t)
    for rows in (1, ops.PARALLEL_MIN_ROWS):  # serial and parallel variants
        x = np.ones((rows, 2, 4), np.float32)
        ops.rope(x, np.zeros(rows, np.int32), 4, 10000.0, 1.0, True)
        x2 = np.ones((rows, 4), np.float32)
        ops.rmsnorm(x2, np.ones(4, np.float32), 1e-5, x2)
        g = np.ones((rows, 4), np.float32)
        ops.gated_act(model.cfg.act, g, g, g)
    dt = time.perf_counter() - t0
    if dt > 2.0:
        log.warning("compiled numba kernels in %.1f s (cached for the next start)", dt)
    return dt


def _all_weights(w):
    yield w.token_embd
    yield w.output
    for lw in w.layers:
        yield from (lw.attn_q, lw.attn_k, lw.attn_v, lw.attn_output, lw.ffn_gate, lw.ffn_up, lw.ffn_down)
