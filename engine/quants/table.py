"""The table of quant types: QuantType (how to compute with one GGML type) and QUANT_TYPES
(GGML type -> its entry, from the generated kernel modules).

Below QTensor (base.py), whose interleaved copy asks the table for its type's `repack`, and
below the GGUF reader (gguf_file.py), which refuses the types the table lacks; the generated
modules (codegen.py) build their entries from QuantType through _kern.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from ..errors import UnsupportedQuantError
from .generated import MODULES, REPACKABLE

_GENERATED = f"{__name__.rpartition('.')[0]}.generated"  # the generated kernel modules' package


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
    unpack: Callable[[np.ndarray, int, int], np.ndarray] | None = (
        None  # (packed, r0, r1) -> raw rows
    )
    matvec_rp: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None
    matvec_same_x_rp: Callable[[list, np.ndarray, list], None] | None = None
    matvec_multi_rp: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None
    matvec_multi_same_x_rp: Callable[[list, np.ndarray, list], None] | None = None
    # the same over x in two 8-bit planes (_q8.quantize_planes: ~15 bits), the default path
    matvec_rp16: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None
    matvec_same_x_rp16: Callable[[list, np.ndarray, list], None] | None = None
    matvec_multi_rp16: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None
    matvec_multi_same_x_rp16: Callable[[list, np.ndarray, list], None] | None = None


class _QuantTypes(Mapping[GGMLQuantizationType, QuantType]):
    """GGML type -> its QuantType entry, importing the type's generated kernel module on first
    use (a start-up imports the modules of the types its model has, not all sixteen)."""

    def __init__(self, modules: Mapping[str, str]):
        self._modules = {GGMLQuantizationType[name]: mod for name, mod in modules.items()}
        self._entries: dict[GGMLQuantizationType, QuantType] = {}

    def __getitem__(self, qtype: GGMLQuantizationType) -> QuantType:
        qt = self._entries.get(qtype)
        if qt is None:
            mod = importlib.import_module(
                f"{_GENERATED}.{self._modules[qtype]}"
            )  # KeyError: unknown
            qt = self._entries[qtype] = getattr(
                mod, GGMLQuantizationType(qtype).name
            )  # (a plain int too)
        return qt

    def get(
        self, qtype, default=None
    ):  # matvec's per-call lookup, without Mapping.get's try/except
        qt = self._entries.get(qtype)
        if qt is not None or qtype not in self._modules:
            return qt if qt is not None else default
        return self[qtype]

    def __iter__(self) -> Iterator[GGMLQuantizationType]:
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)

    def __contains__(self, qtype: object) -> bool:
        return qtype in self._modules


QUANT_TYPES = _QuantTypes(MODULES)

SUPPORTED = frozenset(QUANT_TYPES)
# The types with a row-interleaved copy for the decode kernels (QuantType.repack), known
# without importing their modules.
INTERLEAVED_TYPES = frozenset(GGMLQuantizationType[name] for name in REPACKABLE)


def check_supported(name: str, qtype: GGMLQuantizationType) -> None:
    if qtype not in SUPPORTED:
        raise UnsupportedQuantError(
            f"tensor '{name}' uses quantisation type {getattr(qtype, 'name', qtype)}, "
            f"which ggstation does not support (supported: "
            f"{', '.join(sorted(t.name for t in SUPPORTED))})"
        )
