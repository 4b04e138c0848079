"""Compile (first start) or load from numba's cache (later starts) every kernel a model uses,
on tiny inputs, so the first request does not pay for compilation; logs when it compiles."""

from __future__ import annotations

import logging
import time

import numpy as np

from . import ops, sampling
from .models import moe
from .models.base import qtensors
from .quants import ExpertTensor
from .quants import warmup as warmup_quant

log = logging.getLogger("ggstation.engine")


def cache_is_cold() -> bool:
    """True when numba has cached no engine kernel yet (a first start will compile)."""
    import os
    from pathlib import Path

    root = os.environ.get("NUMBA_CACHE_DIR") or Path(__file__).resolve().parent
    return not any(Path(root).rglob("*.nbi"))


def warmup(model, report=None) -> float:
    """Load or compile every kernel the model uses; `report(message)` hears about compiling."""
    t0 = time.perf_counter()
    if cache_is_cold():
        msg = "first start: compiling numba kernels (a minute or two; cached for later starts)"
        log.warning(msg)
        if report:
            report(msg)
    seen = set()
    for t in _all_weights(model.weights):
        if t.qtype in seen:
            continue
        seen.add(t.qtype)
        warmup_quant(t, model.decode_path)
    inv_freq = np.ones(2)
    for rows in (1, ops.PARALLEL_MIN_ROWS):  # serial and parallel variants
        x = np.ones((rows, 2, 4), np.float32)
        ops.rope(x, np.zeros(rows, np.int32), inv_freq, True)
        x2 = np.ones((rows, 4), np.float32)
        ops.rmsnorm(x2, np.ones(4, np.float32), 1e-5, x2)
        for act in ("silu", "gelu"):
            ops.gated_act(act, x2, x2, x2)
        ops.swiglu_fused(np.ones((rows, 8), np.float32), x2)
    sampling.warm_up()
    if any(isinstance(v, ExpertTensor) for lw in model.weights.layers for v in vars(lw).values()):
        moe.warm_up()  # the router's top-k
    dt = time.perf_counter() - t0
    if dt > 2.0:
        log.warning("kernels ready in %.1f s (compiled ones are cached for the next start)", dt)
    return dt


def _all_weights(w):
    yield w.token_embd
    yield w.output
    for lw in w.layers:
        yield from qtensors(lw)
