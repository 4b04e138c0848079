"""QTensor (a zero-copy view of one weight matrix's packed rows), ExpertTensor (a stack of
them, one per MoE expert) and the QuantType table entry."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType


@dataclass(frozen=True)
class QTensor:
    """One 2-D weight, rows packed in its GGML type, viewed (never copied) from the mmap;
    the default and int8 decode paths add a row-interleaved copy (`packed`) of the types that have one.

    `raw` is (n_rows, row_bytes) uint8 for block types; for F32/F16/BF16 it is the typed
    (n_rows, n_cols) array itself. ggml's ne[0] is `n_cols` (the reduction dimension).
    """

    name: str
    qtype: GGMLQuantizationType
    n_rows: int
    n_cols: int
    raw: np.ndarray
    # whether the decode may keep an interleaved copy: not for the slices of an expert
    # stack, which are made per call (a MoE runs its experts on the row kernels)
    pack: bool = True

    @functools.cached_property
    def packed(self) -> np.ndarray | None:
        """The rows interleaved for the default and int8 paths' kernels (QuantType.repack):
        a copy of raw's size, made on first use and kept with the tensor; None for the types
        without that form."""
        from . import QUANT_TYPES  # the generated kernels import this module

        qt = QUANT_TYPES.get(self.qtype)
        if not self.pack or qt is None or qt.repack is None or self.n_cols % qt.block_elems:
            return None
        from ..gguf_file import release_mapped_pages

        packed = qt.repack(self.raw)
        # the copy serves decode and (quants.raw_rows) the prefill's tiles: the mapped rows need
        # not stay resident beside it (llama.cpp's repacked tensors replace theirs too)
        release_mapped_pages(self.raw)
        return packed

    @property
    def packed_nbytes(self) -> int:
        """Bytes of the interleaved copy if it was made (0 before a decode first used it)."""
        p = self.__dict__.get("packed")  # where cached_property keeps it, without making it
        return 0 if p is None else int(p.nbytes)

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    @property
    def block_size(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][0]

    @property
    def type_size(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][1]


@dataclass(frozen=True)
class ExpertTensor:
    """The weights of n_expert experts stacked in one 3-D tensor (ggml ne = [n_cols, n_rows,
    n_expert]), viewed from the mmap like a QTensor.

    `expert(e)` is expert e's (n_rows, n_cols) matrix as a QTensor: a slice of `raw`, so it
    neither copies nor touches the other experts' pages (a MoE keeps only the experts it
    uses resident). `raw` is (n_expert * n_rows, row_bytes), expert e's rows at
    [e * n_rows, (e + 1) * n_rows).
    """

    name: str
    qtype: GGMLQuantizationType
    n_expert: int
    n_rows: int  # per expert
    n_cols: int
    raw: np.ndarray

    def expert(self, e: int) -> QTensor:
        r0 = int(e) * self.n_rows
        return QTensor(f"{self.name}[{int(e)}]", self.qtype, self.n_rows, self.n_cols,
                       self.raw[r0 : r0 + self.n_rows], pack=False)

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    @property
    def expert_nbytes(self) -> int:
        return self.nbytes // self.n_expert


@dataclass(frozen=True)
class QuantType:
    """Table entry: how to compute with one GGML type.

    dequant(raw_rows, out): raw_rows (m, row_bytes) -> out (m, n_cols) float32
    matvec(raw, x, out):    raw (n_rows, row_bytes), x (n_cols,) f32 -> out (n_rows,) f32
    matvec_multi(raw, x, out): x (T, n_cols) f32 -> out (T, n_rows) f32, weights read once
    get_rows(raw, ids, out): out (len(ids), n_cols) f32 = rows ids dequantised
    matvec_same_x(raws, x, outs): outs[i] = W_i @ x for 1..3 weights, one parallel launch
    matvec_multi_same_x(raws, x, outs): outs[i] (T, n_i) = x (T, n_cols) @ W_i.T for 1..3
                            weights, one launch (Q/K/V, gate/up of a few tokens)
    matvec_i8, matvec_same_x_i8, matvec_multi_i8, matvec_multi_same_x_i8: the same by
                            llama.cpp's integer dots against
                            x quantised to the type's vec_dot_type (None for F32/F16/BF16)
    block_elems:            n_cols must be a multiple of this (32, 256, or 16 for dense)
    """

    qtype: GGMLQuantizationType
    block_size: int
    type_size: int
    dequant: Callable[[np.ndarray, np.ndarray], None]
    matvec: Callable[[np.ndarray, np.ndarray, np.ndarray], None]
    matvec_multi: Callable[[np.ndarray, np.ndarray, np.ndarray], None]
    get_rows: Callable[[np.ndarray, np.ndarray, np.ndarray], None]
    matvec_same_x: Callable[[list, np.ndarray, list], None]
    block_elems: int = 32
    matvec_i8: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None
    matvec_same_x_i8: Callable[[list, np.ndarray, list], None] | None = None
    matvec_multi_i8: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None
    matvec_multi_same_x: Callable[[list, np.ndarray, list], None] | None = None
    matvec_multi_same_x_i8: Callable[[list, np.ndarray, list], None] | None = None
    # the int8 path over row-interleaved weights (types with a Layout.rp_block; None elsewhere):
    # repack(raw) -> packed, then the same calls as the _i8 ones with packed in place of raw
    repack: Callable[[np.ndarray], np.ndarray] | None = None
    unpack: Callable[[np.ndarray, int, int], np.ndarray] | None = None  # (packed, r0, r1) -> raw rows
    matvec_rp: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None
    matvec_same_x_rp: Callable[[list, np.ndarray, list], None] | None = None
    matvec_multi_rp: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None
    matvec_multi_same_x_rp: Callable[[list, np.ndarray, list], None] | None = None
    # the same over x in two 8-bit planes (_q8.quantize_planes: ~15 bits), the default path
    matvec_rp16: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None
    matvec_same_x_rp16: Callable[[list, np.ndarray, list], None] | None = None
    matvec_multi_rp16: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None
    matvec_multi_same_x_rp16: Callable[[list, np.ndarray, list], None] | None = None
