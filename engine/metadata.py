"""Typed reading of GGUF metadata: the expected type and range of a value, or a MetadataError.

The readers take any mapping of key to value: a GGUFFile's metadata (gguf_file.LazyMetadata,
whose `path` and `value_type(key)` let a message name the file and the GGUF type found, and
whose arrays are checked by their item type without a scan) or a plain dict (tokenizer tests).
A missing key raises MetadataError unless a default is given; the default is returned as is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from gguf import GGUFValueType

from .errors import MetadataError

_INT_TYPES = frozenset(
    {
        GGUFValueType.UINT8,
        GGUFValueType.INT8,
        GGUFValueType.UINT16,
        GGUFValueType.INT16,
        GGUFValueType.UINT32,
        GGUFValueType.INT32,
        GGUFValueType.UINT64,
        GGUFValueType.INT64,
    }
)
_NUMBER_TYPES = _INT_TYPES | {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}

# Ranges of the hyper-parameters, by key without its "{arch}." prefix. The typed getters check
# them wherever the key is read (config.py, the architectures), so a value no model can have
# (block_count 2**63, a negative key_length) is a MetadataError naming the key, never a
# numpy error or a loop that does not end. Far above any real model: Llama 3.1 405B has 126
# blocks, 16384-wide embeddings, 53248-wide FFNs, 128 heads; Llama 4 Scout a 10M context.
HPARAM_LIMITS: dict[str, tuple[float, float]] = {
    "block_count": (1, 4096),
    "context_length": (1, 1 << 24),
    "embedding_length": (1, 1 << 20),
    "feed_forward_length": (1, 1 << 24),
    "attention.head_count": (1, 1 << 14),
    "attention.head_count_kv": (1, 1 << 14),
    "attention.key_length": (1, 1 << 16),
    "attention.value_length": (1, 1 << 16),
    "vocab_size": (0, 1 << 24),  # 0: take it from the vocabulary
    "rope.dimension_count": (0, 1 << 16),
    "attention.sliding_window": (0, 1 << 24),
    "rope.scaling.original_context_length": (0, 1 << 24),
    "attention.layer_norm_rms_epsilon": (0.0, 1.0),
    "attention.layer_norm_epsilon": (0.0, 1.0),
    "rope.freq_base": (1e-3, 1e15),
    "rope.freq_base_swa": (1e-3, 1e15),
    "rope.scaling.factor": (0.0, 1e6),  # 0: none
    "rope.scaling.attn_factor": (0.0, 1e6),
    "attn_logit_softcapping": (0.0, 1e6),  # 0: no cap
    "final_logit_softcapping": (0.0, 1e6),
}


_ITEM_KINDS = {  # meta_array's `item` -> (GGUF item types accepted, Python check, words)
    "string": (frozenset({GGUFValueType.STRING}), lambda v: isinstance(v, str), "strings"),
    "int": (
        _INT_TYPES,
        lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool),
        "integers",
    ),
    "number": (
        _NUMBER_TYPES,
        lambda v: isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool),
        "numbers",
    ),
    "bool": (frozenset({GGUFValueType.BOOL}), lambda v: isinstance(v, bool), "booleans"),
}


def _prefix(meta: Mapping[str, Any]) -> str:
    path = getattr(meta, "path", "")
    return f"{path}: " if path else ""


def describe_value(meta: Mapping[str, Any], key: str) -> str:
    """What the file holds under `key`, for messages: "float32 1.5", "array of 3 string"."""
    value_type = getattr(meta, "value_type", None)
    if value_type is not None:
        vtype, item = value_type(key)
        if vtype == GGUFValueType.ARRAY:
            return f"array of {meta.array_len(key)} {item.name.lower()}"  # type: ignore[attr-defined]
        return f"{vtype.name.lower()} {meta[key]!r:.40}"
    v = meta[key]
    if isinstance(v, list):
        return f"array of {len(v)} {type(v[0]).__name__ if v else 'items'}"
    return f"{type(v).__name__} {v!r:.40}"


def _wrong(meta: Mapping[str, Any], key: str, expected: str) -> MetadataError:
    return MetadataError(
        f"{_prefix(meta)}metadata key '{key}' should be {expected}, found {describe_value(meta, key)}"
    )


def _lookup(meta: Mapping[str, Any], key: str, default: Any) -> tuple[bool, Any]:
    """(found, value); a missing key without a default raises."""
    if key in meta:
        return True, meta[key]
    if default is ...:
        raise MetadataError(f"{_prefix(meta)}missing required metadata key '{key}'")
    return False, default


def _check_range(
    meta: Mapping[str, Any], key: str, v: float, lo: float | None, hi: float | None
) -> None:
    if lo is None and hi is None:
        lo, hi = HPARAM_LIMITS.get(key.partition(".")[2], (None, None))
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        bounds = f"{lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}"
        raise MetadataError(
            f"{_prefix(meta)}metadata key '{key}' is {v:g}, out of range ({bounds})"
            if isinstance(v, float)
            else f"{_prefix(meta)}metadata key '{key}' is {v}, out of range ({bounds})"
        )


def meta_str(meta: Mapping[str, Any], key: str, default: Any = ...) -> Any:
    found, v = _lookup(meta, key, default)
    if found and not isinstance(v, str):
        raise _wrong(meta, key, "a string")
    return v


def meta_int(
    meta: Mapping[str, Any],
    key: str,
    default: Any = ...,
    *,
    lo: float | None = None,
    hi: float | None = None,
) -> Any:
    """An integer (of any GGUF integer type); of a per-layer array, the first item."""
    found, v = _lookup(meta, key, default)
    if not found:
        return v
    if isinstance(v, list) and v:  # per-layer arrays: every layer is taken to match the first
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise _wrong(meta, key, "an integer")
    v = int(v)
    _check_range(meta, key, v, lo, hi)
    return v


def meta_float(
    meta: Mapping[str, Any],
    key: str,
    default: Any = ...,
    *,
    lo: float | None = None,
    hi: float | None = None,
) -> Any:
    """A finite number (float or integer types)."""
    found, v = _lookup(meta, key, default)
    if not found:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise _wrong(meta, key, "a number")
    v = float(v)
    if not math.isfinite(v):
        raise _wrong(meta, key, "a finite number")
    _check_range(meta, key, v, lo, hi)
    return v


def meta_bool(meta: Mapping[str, Any], key: str, default: Any = ...) -> Any:
    """A boolean (integer types are read as C reads them: nonzero is true)."""
    found, v = _lookup(meta, key, default)
    if not found:
        return v
    if not isinstance(v, (bool, int, np.integer)):
        raise _wrong(meta, key, "a boolean")
    return bool(v)


def meta_array(
    meta: Mapping[str, Any], key: str, default: Any = ..., item: str | None = None
) -> Any:
    """A list; `item` ("string", "int", "number", "bool") checks the items' type: from the GGUF
    item type when the mapping knows it (no scan of a 262k-entry array), else item by item."""
    value_type = getattr(meta, "value_type", None)
    if key in meta and value_type is not None:
        vtype, item_type = value_type(key)
        kinds = _ITEM_KINDS[item][0] if item else None
        if vtype != GGUFValueType.ARRAY or (kinds is not None and item_type not in kinds):
            raise _wrong(meta, key, f"an array of {_ITEM_KINDS[item][2]}" if item else "an array")
        return meta[key]
    found, v = _lookup(meta, key, default)
    if not found:
        return v
    if not isinstance(v, list):
        raise _wrong(meta, key, f"an array of {_ITEM_KINDS[item][2]}" if item else "an array")
    if item is not None:
        ok = _ITEM_KINDS[item][1]
        if not all(ok(x) for x in v):
            raise _wrong(meta, key, f"an array of {_ITEM_KINDS[item][2]}")
    return v
