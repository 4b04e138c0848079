"""Context: a model plus its KV cache and compute buffers; `decode(batch)` runs the forward pass.

Like llama_context: every buffer (KV cache, per-ubatch activations, weight-tile scratch) is
allocated here once and reused; `memory_report()` reads their real sizes.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import forward
from .backends import DeviceLostError
from .batch import Batch
from .buffers import buffer_shapes
from .config import ModelConfig
from .errors import EngineError, InsufficientMemoryError
from .jit import use_num_threads
from .kv_cache import KVCache
from .memory import (
    MemoryReport,
    check_fits,
    ctx_per_seq,
    estimate_memory,
    fmt_bytes,
    kv_streams,
    mem_check_disabled,
    memory_report,
)
from .model import Model
from .models import step
from .quants import DECODE_PATHS

if TYPE_CHECKING:
    from .backends.gl.offload import GpuContext

log = logging.getLogger("ggstation.engine")


@dataclass(frozen=True)
class ContextParams:
    n_ctx: int = 4096  # total KV positions (0 = the model's training context)
    n_batch: int = 2048  # most tokens one decode() call accepts
    n_ubatch: int = 512  # tokens per forward pass (compute buffers are sized for this)
    n_seq_max: int = 1
    type_k: str = "f16"
    type_v: str = "f16"
    kv_unified: bool = False
    # refuse a context clearly larger than the memory available (memory.check_fits); the
    # environment variable GGSTATION_NO_MEM_CHECK=1 turns the check off too
    check_memory: bool = True
    # the mat-vecs' formulation (quants.DECODE_PATHS: "x16", `--int8` "int8", `--no-int8`
    # "float"); None: the model's (load_model's decode_path). init_from_params loads the model
    # for this path too, since the weights' interleaved copies depend on it.
    decode_path: str | None = None


MAX_SEQ = 256  # llama.cpp's LLAMA_MAX_SEQ
MAX_CTX = (1 << 31) - 1  # positions are int32, as llama_pos is


class Buffers:
    """Activations for one ubatch of n_ubatch tokens, allocated once: the arrays named by
    buffers.buffer_shapes (x, h, o, q, k, v, attn, gate, up, tile and any the
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
    """Raises:
    EngineError: parameters no context can have (n_ctx < 0, n_seq_max 0 or above 256...).
    InsufficientMemoryError: the KV cache and buffers would not fit in the memory available
        (checked before anything is allocated, unless params.check_memory is off).
    """

    def __init__(self, model: Model, params: ContextParams | None = None):
        params = params or ContextParams()
        cfg = model.cfg
        n_ctx = params.n_ctx or cfg.n_ctx_train
        check_params(params, n_ctx)
        self.model = model
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.n_ubatch = min(params.n_ubatch, params.n_batch)
        self.n_batch = params.n_batch
        self.n_seq_max = params.n_seq_max
        self.n_ctx_seq = ctx_per_seq(n_ctx, params.n_seq_max, params.kv_unified)
        self.params = params
        # read by every ubatch (UbatchState.path) and the compiled steps (step.for_context)
        self.decode_path: str = params.decode_path or model.decode_path
        if self.n_ctx_seq > cfg.n_ctx_train:  # llama.cpp's warning, word for word
            log.warning(
                "n_ctx_seq (%d) > n_ctx_train (%d) -- possible training context overflow",
                self.n_ctx_seq,
                cfg.n_ctx_train,
            )
        kw: dict[str, Any] = dict(
            n_seq_max=params.n_seq_max,
            type_k=params.type_k,
            type_v=params.type_v,
            n_ubatch=self.n_ubatch,
            n_batch=params.n_batch,
            kv_unified=params.kv_unified,
        )
        est = estimate_memory(cfg, model.weights_bytes, len(model.gguf.tensors), n_ctx=n_ctx, **kw)
        what = f"n_ctx {n_ctx} with {params.n_seq_max} sequence(s)"
        if params.check_memory and not mem_check_disabled():
            check_fits(est, cfg, len(model.gguf.tensors), what, log, **kw)
        self.gpu = self._gpu_context(model, params)
        try:
            self.kv = self._new_kv()
            self.buf = Buffers(cfg, self.n_ubatch, self.n_ctx_seq)
        except (MemoryError, ValueError) as e:  # numpy: "array is too big", or the OS refused
            raise InsufficientMemoryError(
                f"cannot allocate {fmt_bytes(est.kv_bytes + est.compute_bytes)} for the KV cache and compute "
                f"buffers ({what}): {e}; lower the context size (-c)",
                est.total_bytes,
                0,
            ) from None
        # the compiled decode steps (models/step.py builds them, and again after the KV cache
        # or the decode path changed); compiled (or loaded) now, before the first token
        self.layer_steps: step.LayerSteps | None = None
        step.for_context(self)

    def _gpu_context(self, model: Model, params: ContextParams) -> GpuContext | None:
        """The offloaded layers' KV cache and scratch on the model's GPU, or None (no layers
        offloaded, or the GPU cannot hold them: logged, and every layer runs on the CPU)."""
        if model.gpu is None:
            return None
        from .backends import gl
        from .backends.gl.offload import GpuContext

        n_stream = kv_streams(params.n_seq_max, params.kv_unified and params.n_seq_max > 1)
        try:
            gpu = GpuContext(
                model.gpu,
                self.cfg,
                self.n_ubatch,
                self.n_ctx_seq,
                n_stream,
                params.type_k,
                params.type_v,
            )
            # the GPU buffers go with the context (not at exit: the GL thread may be gone)
            weakref.finalize(self, gpu.close).atexit = False
            return gpu
        except (gl.GLOutOfMemoryError, gl.GLContextLostError, ValueError) as e:
            log.warning(
                "OpenGL: cannot hold the KV cache and compute buffer (%s); this context runs "
                "every layer on the CPU",
                e,
            )
            return None

    def _new_kv(self) -> KVCache:
        """An empty KV cache for these params, its GPU layers' share on self.gpu (if any)."""
        p = self.params
        return KVCache(
            self.cfg,
            self.n_ctx_seq,
            p.n_seq_max,
            p.type_k,
            p.type_v,
            unified=p.kv_unified,
            device=self.gpu,
        )

    def close_gpu(self) -> None:
        """Free the context's GPU buffers (the context must not decode afterwards)."""
        if self.gpu is not None:
            self.gpu.close()

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
        # cells for the whole batch first (a full unified pool fails before any compute)
        self.kv.reserve_batch(
            {int(q): int(batch.pos[batch.seq_id == q][-1]) + 1 for q in np.unique(batch.seq_id)}
        )
        _check_spans_whole(batch, self.n_ubatch)
        width = self.cfg.n_embd if embeddings else self.cfg.n_vocab
        out = np.empty((batch.n_outputs, width), np.float32)
        row = 0
        try:
            for i0 in range(0, len(batch), self.n_ubatch):
                ub = batch.slice(i0, min(i0 + self.n_ubatch, len(batch)))
                n_out = ub.n_outputs
                forward.forward_ubatch(self, ub, out[row : row + n_out], embeddings)
                row += n_out
        except DeviceLostError as e:
            self._lose_gpu()
            raise DeviceLostError(
                f"{e}; the model now runs on the CPU and every sequence's KV cache was "
                "cleared: send the request again"
            ) from None
        return out

    def _lose_gpu(self) -> None:
        """After a GPU reset: every layer on the CPU from now on, with a fresh KV cache (the
        GPU's share of the old one is gone, so no sequence keeps any of it)."""
        log.error(
            "the GPU was lost: falling back to the CPU for every layer; the KV cache is cleared"
        )
        self.gpu = None
        if self.model.gpu is not None:
            self.model.gpu = None  # its buffers died with the context
        self.kv = self._new_kv()

    def memory_report(self) -> MemoryReport:
        return memory_report(self)


def _check_spans_whole(batch: Batch, n_ubatch: int) -> None:
    """A non-causal span (entries that see positions after their own) must sit in one
    ubatch: its later tokens' keys do not exist yet when an earlier ubatch runs."""
    end = batch.attn_end
    if end is None:
        return
    for i0 in range(n_ubatch, len(batch), n_ubatch):
        a, b = i0 - 1, i0
        if batch.seq_id[a] == batch.seq_id[b] and end[a] > batch.pos[a]:
            n = int(end[a] - batch.pos[a]) + 1
            raise EngineError(
                f"an image of more than {n} tokens does not fit in one ubatch "
                f"(n_ubatch = {n_ubatch}); raise -ub/--ubatch-size"
            )


def check_params(params: ContextParams, n_ctx: int) -> None:
    """One clear line for values no context can have (before any arithmetic on them)."""
    if not 0 < n_ctx <= MAX_CTX:
        raise EngineError(
            f"invalid context size {n_ctx}: must be 1..{MAX_CTX} (0 = the model's own)"
        )
    if not 1 <= params.n_seq_max <= MAX_SEQ:
        raise EngineError(
            f"invalid number of sequences {params.n_seq_max} (-np): must be 1..{MAX_SEQ}"
        )
    if params.n_ubatch < 1 or params.n_batch < 1:
        raise EngineError(
            f"n_batch and n_ubatch must be >= 1 (got {params.n_batch} and {params.n_ubatch})"
        )
    if params.decode_path is not None and params.decode_path not in DECODE_PATHS:
        raise EngineError(
            f"invalid decode path {params.decode_path!r}: must be one of {', '.join(DECODE_PATHS)}"
        )
    if not params.kv_unified and n_ctx < params.n_seq_max:
        raise EngineError(
            f"a context of {n_ctx} positions cannot be split over {params.n_seq_max} sequences; "
            "raise -c/--ctx-size or lower -np/--parallel"
        )
