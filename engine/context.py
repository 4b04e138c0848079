"""Context: a model plus its KV cache and compute buffers; `decode(batch)` runs the forward pass.

Like llama_context: every buffer (KV cache, per-ubatch activations, weight-tile scratch) is
allocated here once and reused; `memory_report()` reads their real sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import forward
from .batch import Batch
from .config import ModelConfig
from .errors import EngineError
from .jit import use_num_threads
from .kv_cache import KVCache
from .memory import MemoryReport, buffer_shapes, ctx_per_seq, memory_report
from .model import Model


@dataclass(frozen=True)
class ContextParams:
    n_ctx: int = 4096  # total KV positions (0 = the model's training context)
    n_batch: int = 2048  # most tokens one decode() call accepts
    n_ubatch: int = 512  # tokens per forward pass (compute buffers are sized for this)
    n_seq_max: int = 1
    type_k: str = "f16"
    type_v: str = "f16"
    kv_unified: bool = False


class Buffers:
    """Activations for one ubatch of n_ubatch tokens, allocated once: the arrays named by
    memory.buffer_shapes (x, h, o, q, k, v, attn, gate, up, tile, scores and any the
    architecture adds), as float32 attributes."""

    def __init__(self, cfg: ModelConfig, n_ubatch: int, n_ctx_seq: int):
        for name, shape in buffer_shapes(cfg, n_ubatch, n_ctx_seq).items():
            setattr(self, name, np.zeros(shape, np.float32))

    if TYPE_CHECKING:  # the arrays are set by name in __init__ (not a run-time hook)

        def __getattr__(self, name: str) -> np.ndarray: ...

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in vars(self).values() if isinstance(a, np.ndarray))


class Context:
    def __init__(self, model: Model, params: ContextParams | None = None):
        params = params or ContextParams()
        cfg = model.cfg
        n_ctx = params.n_ctx or cfg.n_ctx_train
        if n_ctx < 0:
            raise EngineError(f"invalid context size {n_ctx}")
        if params.n_seq_max < 1:
            raise EngineError(f"n_seq_max must be >= 1 (got {params.n_seq_max})")
        if params.n_ubatch < 1 or params.n_batch < 1:
            raise EngineError("n_batch and n_ubatch must be >= 1")
        self.model = model
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.n_ubatch = min(params.n_ubatch, params.n_batch)
        self.n_batch = params.n_batch
        self.n_seq_max = params.n_seq_max
        self.n_ctx_seq = ctx_per_seq(n_ctx, params.n_seq_max, params.kv_unified)
        self.params = params
        self.kv = KVCache(cfg, self.n_ctx_seq, params.n_seq_max, params.type_k, params.type_v)
        self.buf = Buffers(cfg, self.n_ubatch, self.n_ctx_seq)

    @property
    def n_vocab(self) -> int:
        return self.cfg.n_vocab

    def decode(self, batch: Batch, embeddings: bool = False) -> np.ndarray:
        """Run the batch; return float32 (n_outputs, n_vocab) logits (or (n_outputs, n_embd)
        final hidden states with embeddings=True) for entries whose logits flag is set."""
        use_num_threads()
        forward.validate_batch(self, batch)
        if len(batch) > self.n_batch:
            raise EngineError(f"batch of {len(batch)} tokens exceeds n_batch = {self.n_batch}")
        width = self.cfg.n_embd if embeddings else self.cfg.n_vocab
        out = np.empty((batch.n_outputs, width), np.float32)
        row = 0
        for i0 in range(0, len(batch), self.n_ubatch):
            ub = batch.slice(i0, min(i0 + self.n_ubatch, len(batch)))
            n_out = ub.n_outputs
            forward.forward_ubatch(self, ub, out[row : row + n_out], embeddings)
            row += n_out
        return out

    def memory_report(self) -> MemoryReport:
        return memory_report(self)
