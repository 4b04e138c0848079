"""GGUFFile: a memory-mapped GGUF with validated header, typed metadata getters, zero-copy tensors.

The header is parsed here with `struct` rather than by gguf.GGUFReader, for two reasons:
every count, length and offset is checked against the file size *before* it is used (hostile
headers make GGUFReader allocate huge arrays or fail with IndexError/KeyError/OverflowError),
and GGUFReader builds one numpy view per array element, which costs seconds for a 262k-token
vocabulary. Here arrays are only located at open time and decoded on first access.

Checks follow ggml's gguf.cpp: magic, version, counts, string/array lengths, value types,
duplicate keys and tensor names, n_dims, dims, tensor types, general.alignment, tensor
offsets (aligned, inside the file, non-overlapping). Every problem raises GGUFError
"<path>: <problem>".

File layout (little-endian):
    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv x      (key: str, type: u32, value)
    n_tensors x (name: str, n_dims: u32, ne: u64[n_dims], type: u32, offset: u64)
    padding to general.alignment (default 32), then tensor data; offsets are relative to it.
    str = (len: u64, utf-8 bytes); array value = (item type: u32, count: u64, items)
"""

from __future__ import annotations

import os
import struct
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar, overload

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .errors import GGUFError
from .metadata import (  # noqa: F401 - the typed readers are also imported from here
    HPARAM_LIMITS,
    describe_value,
    meta_array,
    meta_bool,
    meta_float,
    meta_int,
    meta_str,
)
from .quants.base import ExpertTensor, QTensor
from .quants.table import check_supported

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
REQUIRED_KEYS = ("general.architecture",)

# Hard caps on top of "must fit in the remaining bytes"; far above any real model.
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 20
MAX_STRING_ARRAY = 1 << 24  # a string array is walked item by item at open time
MAX_NAME_BYTES = 1 << 16  # keys and tensor names
_HEADER = struct.Struct("<4sIQQ")
_D = TypeVar("_D")  # a metadata getter's default
_MIN_KV_BYTES = 8 + 4 + 1  # empty key, type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dim, type, offset

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_SCALARS = {t: struct.Struct(f) for t, f in _SCALAR_FORMATS.items()}
_ARRAY_DTYPES = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "<u1",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}
# Tensor types viewed with their own dtype; every other type is viewed as packed uint8 rows.
_PLAIN_DTYPES = {
    GGMLQuantizationType.F32: "<f4",
    GGMLQuantizationType.F16: "<f2",
    GGMLQuantizationType.F64: "<f8",
    GGMLQuantizationType.I8: "<i1",
    GGMLQuantizationType.I16: "<i2",
    GGMLQuantizationType.I32: "<i4",
    GGMLQuantizationType.I64: "<i8",
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@contextmanager
def closing_on_error(f: GGUFFile) -> Iterator[None]:
    """Close `f` when the block raises, and let go of the map at once, not when the garbage
    collector runs: the frames the exception passed through keep their locals alive, tensor
    views among them, for as long as the exception lives (a caller may keep it for minutes,
    and a traceback that references itself is a cycle only the collector breaks)."""
    try:
        yield
    except BaseException as e:
        f.close()
        traceback.clear_frames(e.__traceback__)  # skips the frames still running
        raise


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order: shape[0] = ne[0] (innermost, contiguous)
    offset: int  # absolute byte offset in the file
    nbytes: int
    data: np.ndarray  # zero-copy view into the map


class _ArrayRef(NamedTuple):
    """Where an array value lies in the file; decoded into a list on first access."""

    key: str
    item_type: GGUFValueType
    n_items: int  # not `count`, which would shadow tuple.count
    start: int
    end: int


class _Cursor:
    """Bounds-checked little-endian reader over the header bytes."""

    def __init__(self, buf: memoryview, path: str):
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)

    def fail(self, problem: str) -> GGUFError:
        return GGUFError(f"{self.path}: {problem}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(
                f"truncated: {what} at offset {self.pos} needs {n} bytes, "
                f"but the file ends at {self.size}"
            )

    def scalar(self, fmt: struct.Struct, what: str) -> Any:
        self.need(fmt.size, what)
        (v,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return v

    def u32(self, what: str) -> int:
        return self.scalar(_U32, what)

    def u64(self, what: str) -> int:
        return self.scalar(_U64, what)

    def string(self, what: str, max_len: int | None = None) -> str:
        n = self.u64(f"length of {what}")
        if n > self.size - self.pos or (max_len is not None and n > max_len):
            raise self.fail(
                f"{what} at offset {self.pos - 8} has absurd length {n} "
                f"({self.size - self.pos} bytes remain in the file)"
            )
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(
                f"{what} at offset {self.pos - n} is not valid UTF-8: {raw[:40]!r}"
            ) from None

    def count(self, what: str, min_item_bytes: int, cap: int) -> int:
        n = self.u64(what)
        remaining = self.size - self.pos
        if n > cap:
            raise self.fail(f"absurd {what} {n} (the limit is {cap})")
        if n * min_item_bytes > remaining:
            raise self.fail(
                f"absurd {what} {n}: needs at least {n * min_item_bytes} bytes, but only "
                f"{remaining} remain (truncated or corrupt file)"
            )
        return n


class LazyMetadata(Mapping):
    """The GGUF key/value pairs as a read-only mapping; arrays are decoded on first access.

    `path` and `value_type(key)` let the typed readers below say which file and what GGUF type
    a wrong value has.
    """

    def __init__(
        self,
        values: dict[str, Any],
        decode,
        types: dict[str, tuple[GGUFValueType, GGUFValueType | None]],
        path: str = "",
    ):
        self._values = values
        self._decode = decode
        self._types = types  # key -> (value type, item type of an array)
        self.path = path

    def value_type(self, key: str) -> tuple[GGUFValueType, GGUFValueType | None]:
        return self._types[key]

    def array_len(self, key: str) -> int:
        """Items of an array value, without decoding it."""
        v = self._values[key]
        return v.n_items if isinstance(v, _ArrayRef) else len(v)

    def __getitem__(self, key: str) -> Any:
        v = self._values[key]
        if isinstance(v, _ArrayRef):
            v = self._values[key] = self._decode(v)
        return v

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"LazyMetadata({len(self)} keys)"


class GGUFFile:
    """A memory-mapped GGUF file. Tensors are views into the map, never copies.

    Args:
        path: the .gguf file. Anything wrong with it raises GGUFError naming the file.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise GGUFError(f"{self.path}: no such file")
        if os.path.isdir(self.path):
            raise GGUFError(f"{self.path}: is a directory, not a GGUF file")
        self.file_size = os.path.getsize(self.path)
        if self.file_size < _HEADER.size:
            self._fail_short_file()
        self.tensors: dict[str, TensorInfo] = {}
        try:  # no local name for the map: a failed open must leave nothing holding it
            self._map: np.memmap | None = np.memmap(
                self.path, dtype=np.uint8, mode="r"
            )  # None once closed
        except (OSError, ValueError) as e:
            raise GGUFError(f"{self.path}: cannot map file: {e}") from None
        with closing_on_error(self):
            self._open()

    def _open(self) -> None:
        assert self._map is not None
        self.file_size = len(self._map)  # what is mapped is what gets checked
        buf = self._map.data
        try:
            cur = _Cursor(buf, self.path)
            self.version, n_tensors, n_kv = self._parse_header(cur)
            values, types = self._parse_kv(cur, n_kv)
            infos = self._parse_tensor_infos(cur, n_tensors)
        finally:
            buf.release()
        self.metadata: LazyMetadata = LazyMetadata(values, self._decode_array, types, self.path)
        for key in REQUIRED_KEYS:
            if key not in values:
                raise GGUFError(f"{self.path}: missing required metadata key '{key}'")
        if not isinstance(values["general.architecture"], str):
            raise GGUFError(f"{self.path}: metadata key 'general.architecture' should be a string")
        self.alignment = self._alignment(values)
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors = self._layout_tensors(infos)

    # header parsing -------------------------------------------------------------------------
    def _fail_short_file(self):
        try:
            with open(self.path, "rb") as fh:
                magic = fh.read(4)
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot read: {e.strerror}") from None
        if len(magic) == 4 and magic != GGUF_MAGIC:
            raise GGUFError(
                f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})"
            )
        raise GGUFError(
            f"{self.path}: truncated: {self.file_size} bytes, a GGUF header needs {_HEADER.size}"
        )

    def _parse_header(self, cur: _Cursor) -> tuple[int, int, int]:
        magic, version = struct.unpack_from("<4sI", cur.buf, 0)
        if magic != GGUF_MAGIC:
            raise cur.fail(f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        if version not in SUPPORTED_VERSIONS:
            if int.from_bytes(version.to_bytes(4, "little"), "big") in SUPPORTED_VERSIONS:
                raise cur.fail("big-endian GGUF files are not supported")
            raise cur.fail(
                f"unsupported GGUF version {version} (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})"
            )
        cur.pos = 8
        n_tensors = cur.count("tensor count", _MIN_TENSOR_INFO_BYTES, MAX_TENSORS)
        n_kv = cur.count("metadata key/value count", _MIN_KV_BYTES, MAX_KV)
        return version, n_tensors, n_kv

    def _parse_kv(self, cur: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict]:
        values: dict[str, Any] = {}
        types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
        for i in range(n_kv):
            key = cur.string(f"key of metadata entry {i}", MAX_NAME_BYTES)
            if key in values:
                raise cur.fail(f"duplicate metadata key '{key}'")
            raw_type = cur.u32(f"value type of '{key}'")
            v = values[key] = self._parse_value(cur, key, raw_type)
            types[key] = (
                GGUFValueType(raw_type),
                v.item_type if isinstance(v, _ArrayRef) else None,
            )
        return values, types

    def _value_type(self, cur: _Cursor, key: str, raw_type: int) -> GGUFValueType:
        try:
            return GGUFValueType(raw_type)
        except ValueError:
            raise cur.fail(f"metadata key '{key}' has unknown value type {raw_type}") from None

    def _parse_value(self, cur: _Cursor, key: str, raw_type: int) -> Any:
        vtype = self._value_type(cur, key, raw_type)
        if vtype == GGUFValueType.STRING:
            return cur.string(f"value of '{key}'")
        if vtype != GGUFValueType.ARRAY:
            return cur.scalar(_SCALARS[vtype], f"value of '{key}'")
        item_type = self._value_type(cur, key, cur.u32(f"array item type of '{key}'"))
        if item_type == GGUFValueType.ARRAY:
            raise cur.fail(
                f"metadata key '{key}' is a nested array, which GGUF readers do not support"
            )
        if item_type == GGUFValueType.STRING:
            n = cur.count(f"array length of '{key}'", 8, MAX_STRING_ARRAY)
            start = cur.pos
            self._skip_strings(cur, key, n)
        else:
            size = _SCALARS[item_type].size
            n = cur.count(f"array length of '{key}'", size, 1 << 62)
            start = cur.pos
            cur.pos += n * size
        return _ArrayRef(key, item_type, n, start, cur.pos)

    @staticmethod
    def _skip_strings(cur: _Cursor, key: str, n: int) -> None:
        """Walk n length-prefixed strings without decoding them (hot loop for big vocabularies)."""
        buf, pos, size, unpack = cur.buf, cur.pos, cur.size, _U64.unpack_from
        for i in range(n):
            if pos + 8 > size:
                cur.pos = pos
                cur.need(8, f"length of item {i} of '{key}'")
            (length,) = unpack(buf, pos)
            pos += 8
            if length > size - pos:
                raise cur.fail(
                    f"item {i} of '{key}' at offset {pos - 8} has absurd length {length} "
                    f"({size - pos} bytes remain in the file)"
                )
            pos += length
        cur.pos = pos

    def _parse_tensor_infos(
        self, cur: _Cursor, n_tensors: int
    ) -> list[tuple[str, int, tuple, int]]:
        infos, seen = [], set()
        for i in range(n_tensors):
            name = cur.string(f"name of tensor {i}", MAX_NAME_BYTES)
            if name in seen:
                raise cur.fail(f"duplicate tensor name '{name}'")
            seen.add(name)
            n_dims = cur.u32(f"n_dims of tensor '{name}'")
            if not 1 <= n_dims <= MAX_DIMS:
                raise cur.fail(f"tensor '{name}' has {n_dims} dimensions (must be 1..{MAX_DIMS})")
            cur.need(8 * n_dims, f"shape of tensor '{name}'")
            shape = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos)
            cur.pos += 8 * n_dims
            raw_type = cur.u32(f"type of tensor '{name}'")
            offset = cur.u64(f"data offset of tensor '{name}'")
            infos.append((name, raw_type, shape, offset))
        return infos

    def _alignment(self, values: dict[str, Any]) -> int:
        if "general.alignment" not in values:
            return DEFAULT_ALIGNMENT
        a = values["general.alignment"]
        # struct decodes u32 to int; any other value type (array, string, float) is rejected.
        if not isinstance(a, int) or isinstance(a, bool) or a <= 0 or a & (a - 1):
            raise GGUFError(f"{self.path}: general.alignment must be a power of two, got {a!r:.40}")
        return a

    # tensor table ---------------------------------------------------------------------------
    def _layout_tensors(self, infos: list) -> dict[str, TensorInfo]:
        tensors: dict[str, TensorInfo] = {}
        for name, raw_type, shape, offset in infos:
            qtype, nbytes = self._check_tensor(name, raw_type, shape)
            if offset % self.alignment:
                raise GGUFError(
                    f"{self.path}: tensor '{name}' data offset {offset} is not a multiple of "
                    f"the alignment {self.alignment}"
                )
            start = self.data_offset + offset
            if start + nbytes > self.file_size:
                raise GGUFError(
                    f"{self.path}: tensor '{name}' data (offset {start}, {nbytes} bytes) extends "
                    f"past the end of the file ({self.file_size} bytes); is the file truncated?"
                )
            data = self._view(qtype, shape, start, nbytes)
            tensors[name] = TensorInfo(name, qtype, tuple(shape), start, nbytes, data)
        by_offset = sorted(tensors.values(), key=lambda t: t.offset)
        for prev, t in zip(by_offset, by_offset[1:], strict=False):
            if t.offset < prev.offset + prev.nbytes:
                raise GGUFError(
                    f"{self.path}: tensor '{t.name}' data (offset {t.offset}) overlaps tensor "
                    f"'{prev.name}' (offset {prev.offset}, {prev.nbytes} bytes)"
                )
        return tensors

    def _check_tensor(
        self, name: str, raw_type: int, shape: tuple[int, ...]
    ) -> tuple[GGMLQuantizationType, int]:
        """Returns (qtype, nbytes) after checking the dims and the type id."""
        n_elements = 1
        for d in shape:
            if d == 0 or d >= 1 << 63:  # ggml's ne is int64: the top half is negative
                signed = [x - (1 << 64) if x >= 1 << 63 else x for x in shape]
                raise GGUFError(
                    f"{self.path}: tensor '{name}' has invalid shape {signed} (dims must be positive)"
                )
            n_elements *= d
        if n_elements >= 1 << 63:
            raise GGUFError(
                f"{self.path}: tensor '{name}' shape {list(shape)} has too many elements"
            )
        try:
            qtype = GGMLQuantizationType(raw_type)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise GGUFError(
                f"{self.path}: tensor '{name}' has unknown type id {raw_type}"
            ) from None
        if shape[0] % block:
            raise GGUFError(
                f"{self.path}: tensor '{name}' row length {shape[0]} is not a multiple of the "
                f"{qtype.name} block size {block}"
            )
        return qtype, n_elements // block * type_size

    def _view(
        self, qtype: GGMLQuantizationType, shape: tuple[int, ...], start: int, nbytes: int
    ) -> np.ndarray:
        """numpy view (reversed ggml shape); packed types keep bytes in the last axis."""
        assert self._map is not None  # called while opening
        # a plain ndarray over the map (its base keeps the map alive): numba types an
        # np.memmap subclass through its slow Python path, ~0.6 us per weight per kernel call
        raw = self._map[start : start + nbytes].view(np.ndarray)
        np_shape = tuple(reversed(shape))
        dtype = _PLAIN_DTYPES.get(qtype)
        if dtype is not None:
            return raw.view(dtype).reshape(np_shape)
        block, type_size = GGML_QUANT_SIZES[qtype]
        return raw.reshape(*np_shape[:-1], np_shape[-1] // block * type_size)

    def _decode_array(self, ref: _ArrayRef) -> list:
        if self._map is None:
            raise GGUFError(f"{self.path}: file is closed (reading metadata key '{ref.key}')")
        if ref.item_type != GGUFValueType.STRING:
            arr = self._map[ref.start : ref.end].view(_ARRAY_DTYPES[ref.item_type])
            return (arr != 0).tolist() if ref.item_type == GGUFValueType.BOOL else arr.tolist()
        blob = self._map[ref.start : ref.end].tobytes()
        out, pos, unpack = [], 0, _U64.unpack_from
        for i in range(ref.n_items):
            (n,) = unpack(blob, pos)
            pos += 8
            try:
                out.append(blob[pos : pos + n].decode("utf-8"))
            except UnicodeDecodeError:
                raise GGUFError(
                    f"{self.path}: item {i} of metadata key '{ref.key}' is not valid UTF-8: "
                    f"{blob[pos : pos + 40]!r}"
                ) from None
            pos += n
        return out

    # metadata ---------------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        return self.get_str("general.architecture")

    def has(self, key: str) -> bool:
        return key in self.metadata

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value (no type check); prefer the typed getters."""
        return self.metadata.get(key, default)

    def array_len(self, key: str) -> int | None:
        """Items of array `key` without decoding it; None when the key is absent or not an array."""
        if key not in self.metadata or self.metadata.value_type(key)[0] != GGUFValueType.ARRAY:
            return None
        return self.metadata.array_len(key)

    # The typed getters (meta_* below): a missing key raises MetadataError, or gives `default`
    # (returned as is, so `get_int(key, None)` is `int | None`); a value of the wrong type or
    # out of range (`lo`/`hi`, else HPARAM_LIMITS) raises MetadataError naming key and value.
    @overload
    def get_str(self, key: str) -> str: ...
    @overload
    def get_str(self, key: str, default: _D) -> str | _D: ...
    def get_str(self, key: str, default: Any = ...) -> Any:
        return meta_str(self.metadata, key, default)

    @overload
    def get_int(self, key: str, *, lo: int | None = None, hi: int | None = None) -> int: ...
    @overload
    def get_int(
        self, key: str, default: _D, *, lo: int | None = None, hi: int | None = None
    ) -> int | _D: ...
    def get_int(
        self, key: str, default: Any = ..., *, lo: int | None = None, hi: int | None = None
    ) -> Any:
        return meta_int(self.metadata, key, default, lo=lo, hi=hi)

    @overload
    def get_float(self, key: str, *, lo: float | None = None, hi: float | None = None) -> float: ...
    @overload
    def get_float(
        self, key: str, default: _D, *, lo: float | None = None, hi: float | None = None
    ) -> float | _D: ...
    def get_float(
        self, key: str, default: Any = ..., *, lo: float | None = None, hi: float | None = None
    ) -> Any:
        return meta_float(self.metadata, key, default, lo=lo, hi=hi)

    @overload
    def get_bool(self, key: str) -> bool: ...
    @overload
    def get_bool(self, key: str, default: _D) -> bool | _D: ...
    def get_bool(self, key: str, default: Any = ...) -> Any:
        return meta_bool(self.metadata, key, default)

    @overload
    def get_array(self, key: str, *, item: str | None = None) -> list: ...
    @overload
    def get_array(self, key: str, default: _D, *, item: str | None = None) -> list | _D: ...
    def get_array(self, key: str, default: Any = ..., *, item: str | None = None) -> Any:
        return meta_array(self.metadata, key, default, item)

    # tensors --------------------------------------------------------------------------------
    def _info(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(f"{self.path}: missing tensor '{name}'")
        return info

    def qtensor(self, name: str, shape: tuple[int, ...] | None = None) -> QTensor:
        """A 2-D weight as a QTensor; `shape` (ggml order) is checked when given."""
        info = self._info(name)
        if shape is not None and tuple(info.shape) != tuple(shape):
            raise GGUFError(
                f"{self.path}: tensor '{name}' has shape {list(info.shape)}, expected {list(shape)}"
            )
        check_supported(name, info.qtype)
        n_cols = info.shape[0]
        n_rows = int(np.prod(info.shape[1:])) if len(info.shape) > 1 else 1
        block, type_size = GGML_QUANT_SIZES[info.qtype]
        data = info.data
        if info.qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            raw = data.reshape(n_rows, n_cols)
        else:
            raw = data.view(np.uint8).reshape(n_rows, n_cols // block * type_size)
        return QTensor(name, info.qtype, n_rows, n_cols, raw)

    def expert_tensor(self, name: str, shape: tuple[int, int, int]) -> ExpertTensor:
        """A 3-D MoE expert weight, ggml shape (n_cols, n_rows, n_expert), as an ExpertTensor
        (zero-copy per-expert views); the shape must match exactly."""
        info = self._info(name)
        if len(info.shape) != 3 or tuple(info.shape) != tuple(shape):
            raise GGUFError(
                f"{self.path}: tensor '{name}' has shape {list(info.shape)}, expected the 3-D expert "
                f"tensor {list(shape)} (columns, rows per expert, experts)"
            )
        w = self.qtensor(name)
        return ExpertTensor(name, w.qtype, shape[2], shape[1], shape[0], w.raw)

    def rows_f32(self, name: str, shape: tuple[int, int]) -> np.ndarray:
        """A small 2-D tensor, ggml shape (n_cols, n_rows), as float32 (n_rows, n_cols), e.g.
        per-expert biases (n_ff_exp, n_expert); the shape must match exactly."""
        info = self._info(name)
        if tuple(info.shape) != tuple(shape):
            raise GGUFError(
                f"{self.path}: tensor '{name}' has shape {list(info.shape)}, expected {list(shape)}"
            )
        return self.vector(name).reshape(shape[1], shape[0])

    def vector(self, name: str, n: int | None = None) -> np.ndarray:
        """A 1-D F32 tensor (norm weights, biases) as float32 (small, may be copied)."""
        info = self._info(name)
        if n is not None and int(np.prod(info.shape)) != n:
            raise GGUFError(
                f"{self.path}: tensor '{name}' has {list(info.shape)} elements, expected {n}"
            )
        if info.qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            return np.asarray(info.data, dtype=np.float32).reshape(-1)
        check_supported(name, info.qtype)
        from .quants.reference import dequant_ref

        return dequant_ref(info.data.reshape(1, -1), info.qtype).reshape(-1)

    @property
    def tensor_data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def closed(self) -> bool:
        return self._map is None

    def maps(self) -> list[np.ndarray]:
        """The file mapping(s) the tensors view (none once closed): what is resident of the
        weights is asked of these (memory.resident_bytes)."""
        return [] if self._map is None else [self._map]

    def close(self) -> None:
        """Drops this object's references to the map (views handed out keep it alive)."""
        self._map = None
        self.tensors = {}

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r}, {len(self.tensors)} tensors, {len(self.metadata)} keys)"
