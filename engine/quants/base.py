"""QTensor (a zero-copy view of one weight matrix's packed rows) and ExpertTensor (a stack of
them, one per MoE expert); the QuantType table entry is table.py's."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..mapped_pages import release_mapped_pages
from .table import QUANT_TYPES


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
        qt = QUANT_TYPES.get(self.qtype)
        if not self.pack or qt is None or qt.repack is None or self.n_cols % qt.block_elems:
            return None
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
        return QTensor(
            f"{self.name}[{int(e)}]",
            self.qtype,
            self.n_rows,
            self.n_cols,
            self.raw[r0 : r0 + self.n_rows],
            pack=False,
        )

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    @property
    def expert_nbytes(self) -> int:
        return self.nbytes // self.n_expert
