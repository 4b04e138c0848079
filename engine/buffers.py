"""The compute buffers of a context: the float32 arrays one ubatch works in, by name and shape.

One formula serves the CPU's allocation (context.Buffers), the GPU's scratch
(backends/gl/offload.py) and the estimate before loading (memory.py), so it sits below all
three: it knows the model's sizes (config.ModelConfig) and the BLAS tile of the quants.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .quants import TILE_ROWS

if TYPE_CHECKING:
    from .config import ModelConfig


def buffer_shapes(cfg: ModelConfig, n_ubatch: int, n_ctx_seq: int) -> dict[str, tuple[int, ...]]:
    """The float32 arrays of context.Buffers by name: the one formula for the real allocation
    and the estimate before loading. (None grows with n_ctx_seq since the decode attention
    kernel stopped keeping a row of scores per head and position.)"""
    U, E, F = n_ubatch, cfg.n_embd, cfg.n_ff
    q_dim, kv_dim = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    v_dim, attn_dim = cfg.n_head_kv * cfg.head_dim_v, cfg.n_head * cfg.head_dim_v
    shapes = dict(
        x=(U, E),  # residual stream
        h=(U, E),  # normed input of a block
        o=(U, E),  # block output
        q=(U, q_dim),
        k=(U, kv_dim),
        v=(U, v_dim),
        attn=(U, attn_dim),  # attention output, before the output projection
        gate=(U, F),
        up=(U, F),
        tile=(TILE_ROWS * max(E, F, attn_dim),),  # dequantised weight tile for BLAS
    )
    shapes.update((name, (U, width)) for name, width in cfg.extra_acts)
    return shapes


def compute_buffer_bytes(cfg: ModelConfig, n_ubatch: int, n_ctx_seq: int) -> int:
    """Bytes of context.Buffers for these sizes (engine/context.py allocates exactly this)."""
    return 4 * sum(math.prod(s) for s in buffer_shapes(cfg, n_ubatch, n_ctx_seq).values())
