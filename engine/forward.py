"""The generic decoder driver over one ubatch: embed, one architecture block per layer,
commit the KV cache, head. Everything architecture-specific is in engine/models/<arch>.py,
built from the shared pieces of engine/models/layers.py.
"""

from __future__ import annotations

import numba
import numpy as np

from .batch import Batch
from .errors import ContextOverflowError, EngineError
from .models import step
from .models.layers import UbatchState
from .quants import MATVEC_MAX_TOKENS


def validate_batch(ctx, batch: Batch) -> None:
    if len(batch) == 0:
        raise EngineError("empty batch")
    V = ctx.cfg.n_vocab
    low = 0 if batch.embd is None else -(1 << 31)  # negative: the entry's row of embd
    if batch.tokens.min() < low or batch.tokens.max() >= V:
        bad = int(batch.tokens[(batch.tokens < low) | (batch.tokens >= V)][0])
        raise EngineError(f"token id {bad} out of range [0, {V})")
    if batch.embd is not None and batch.embd.shape != (len(batch), ctx.cfg.n_embd):
        raise EngineError(
            f"batch embeddings have shape {batch.embd.shape}, expected ({len(batch)}, "
            f"{ctx.cfg.n_embd})"
        )
    if batch.attn_end is not None:
        if np.any(batch.attn_end < batch.pos):
            raise EngineError("attn_end must not be before the entry's own position")
        if ctx.gpu is not None and np.any(batch.attn_end > batch.pos):
            raise EngineError(
                "non-causal image tokens are not supported with layers offloaded to the GPU "
                "(-ngl 0 runs them)"
            )
    if batch.seq_id.min() < 0 or batch.seq_id.max() >= ctx.n_seq_max:
        raise EngineError(f"sequence id out of range [0, {ctx.n_seq_max})")
    for s in np.unique(batch.seq_id):
        pos = batch.pos[batch.seq_id == s]
        p0 = ctx.kv.seq_len(int(s))
        if pos[0] != p0 or np.any(np.diff(pos) != 1):
            raise EngineError(
                f"sequence {int(s)}: positions must continue the sequence from {p0} in order "
                f"(got {int(pos[0])}..{int(pos[-1])})"
            )
        if pos[-1] >= ctx.n_ctx_seq:
            raise ContextOverflowError(
                int(pos[-1]) + 1,
                ctx.n_ctx_seq,
                f"sequence {int(s)}: {int(pos[-1]) + 1} tokens exceed the context size of "
                f"{ctx.n_ctx_seq} per sequence",
            )


def forward_ubatch(ctx, ub: Batch, out: np.ndarray, embeddings: bool) -> None:
    if len(ub) <= MATVEC_MAX_TOKENS:
        _forward(ctx, ub, out, embeddings)
        return
    # Batch path: BLAS owns the cores. numba's own workers would only fight OpenBLAS's
    # spinning threads for them (measured: pp512 swung 104-274 tok/s), so numba runs
    # single-threaded on the calling thread until the ubatch is done.
    n_threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        _forward(ctx, ub, out, embeddings)
    finally:
        numba.set_num_threads(n_threads)


def _forward(ctx, ub: Batch, out: np.ndarray, embeddings: bool) -> None:
    arch, w = ctx.model.arch, ctx.model.weights
    s = UbatchState(ctx, ub)
    arch.embed(s, w)
    gpu = ctx.gpu  # the last layers (and maybe the head) on a GPU, or None
    # the compiled decode steps attend causally: an image span that sees itself takes the
    # generic path
    causal = ub.attn_end is None or not np.any(ub.attn_end > ub.pos)
    steps = step.for_context(ctx) if len(ub) <= MATVEC_MAX_TOKENS and causal else None
    us = steps.for_ubatch(s) if steps is not None else None
    for il in range(len(w.layers) if gpu is None else gpu.gm.first_layer):
        if us is None or not us.run(il):
            arch.block(s, il, w.layers[il])
    head_done = gpu is not None and gpu.run(s, out, embeddings)
    for seq, idx in s.groups:
        ctx.kv.commit(seq, int(ub.pos[idx[-1]]) + 1)
    if not head_done:
        arch.head(s, w, out, embeddings)
