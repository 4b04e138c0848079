"""The bad-GGUF corpus: a small valid file from gguf.GGUFWriter, then byte surgery per case.

`valid_gguf(path)` writes the base file. `CASES` maps a case name to a function that turns
the base bytes into a corrupt file, and the substring GGUFError's message must contain.
`write_corpus(dir)` writes every case and returns {name: (path, expected substring)}.

Base layout (ggml shapes): tensor_a F32 [32, 4], tensor_b Q8_0 [64, 2], tensor_c F32 [8];
keys general.architecture, general.name, llama.block_count, test.key_a, test.key_b,
tokenizer.ggml.tokens (3 strings), tokenizer.ggml.scores (3 floats).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.quants import quantize


def valid_gguf(path: str | Path, *, alignment: int | None = None, extra_kv: dict | None = None) -> Path:
    """Writes the small valid base file and returns its path."""
    path = Path(path)
    w = GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_name("hostile-base")
    w.add_uint32("llama.block_count", 1)
    w.add_uint32("test.key_a", 1)
    w.add_uint32("test.key_b", 2)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    w.add_array("tokenizer.ggml.scores", [0.0, 1.0, 2.0])
    for key, (value, vtype) in (extra_kv or {}).items():
        w.add_key_value(key, value, vtype)
    rng = np.random.default_rng(0)
    w.add_tensor("tensor_a", rng.standard_normal((4, 32)).astype(np.float32))
    q = quantize(rng.standard_normal((2, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
    w.add_tensor("tensor_b", q, raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("tensor_c", np.arange(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# locating fields in the base bytes ----------------------------------------------------------
def _gguf_str(s: str) -> bytes:
    return struct.pack("<Q", len(s.encode())) + s.encode()


def key_offset(data: bytes, key: str) -> int:
    """Offset of the value type (u32) that follows metadata key `key`."""
    i = data.index(_gguf_str(key))
    return i + len(_gguf_str(key))


def tensor_info_offsets(data: bytes, name: str) -> dict[str, int]:
    """Offsets of n_dims, dims[0], type and offset in the tensor info of `name`."""
    n_dims_at = data.index(_gguf_str(name)) + len(_gguf_str(name))
    (n_dims,) = struct.unpack_from("<I", data, n_dims_at)
    type_at = n_dims_at + 4 + 8 * n_dims
    return {"n_dims": n_dims_at, "dims": n_dims_at + 4, "type": type_at, "offset": type_at + 4}


def _put(data: bytes, at: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def _replace_once(data: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new) and data.count(old) == 1, (old, new)
    return data.replace(old, new)


def _tensor_field(name: str, field: str, fmt: str, value) -> Callable[[bytes], bytes]:
    return lambda d: _put(d, tensor_info_offsets(d, name)[field], fmt, value)


def _tensor_offset_delta(name: str, delta: int) -> Callable[[bytes], bytes]:
    def f(d: bytes) -> bytes:
        at = tensor_info_offsets(d, name)["offset"]
        return _put(d, at, "<Q", struct.unpack_from("<Q", d, at)[0] + delta)

    return f


def _copy_tensor_offset(src: str, dst: str) -> Callable[[bytes], bytes]:
    def f(d: bytes) -> bytes:
        (off,) = struct.unpack_from("<Q", d, tensor_info_offsets(d, src)["offset"])
        return _put(d, tensor_info_offsets(d, dst)["offset"], "<Q", off)

    return f


def _array_len(key: str, value: int) -> Callable[[bytes], bytes]:
    return lambda d: _put(d, key_offset(d, key) + 4 + 4, "<Q", value)


def _string_item_to_eof(d: bytes) -> bytes:
    """Item 0 of the token array grows so that item 1's length field straddles the end of file."""
    item0 = key_offset(d, "tokenizer.ggml.tokens") + 4 + 4 + 8
    return _put(d, item0, "<Q", len(d) - (item0 + 8) - 4)


# case name -> (corrupt(base bytes) -> bytes, substring the GGUFError message must contain)
CASES: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "empty": (lambda d: b"", "truncated: 0 bytes"),
    "truncated_header": (lambda d: d[:20], "truncated: 20 bytes"),
    "truncated_in_kv": (
        lambda d: d[: key_offset(d, "llama.block_count") + 2],
        "truncated: value type of 'llama.block_count'",
    ),
    "truncated_in_string_array": (
        lambda d: d[: key_offset(d, "tokenizer.ggml.tokens") + 4 + 8 + 9],
        "absurd array length of 'tokenizer.ggml.tokens' 3: needs at least 24 bytes",
    ),
    "truncated_in_tensor_info": (
        lambda d: d[: tensor_info_offsets(d, "tensor_b")["dims"] + 3],
        "truncated: shape of tensor 'tensor_b'",
    ),
    "truncated_in_data": (lambda d: d[: len(d) - 16], "extends past the end of the file"),
    "short_text_file": (lambda d: b"hello\n", "not a GGUF file (magic b'hell'"),
    "wrong_magic": (lambda d: b"GGML" + d[4:], "not a GGUF file (magic b'GGML'"),
    "version_1": (lambda d: _put(d, 4, "<I", 1), "unsupported GGUF version 1"),
    "version_99": (lambda d: _put(d, 4, "<I", 99), "unsupported GGUF version 99"),
    "big_endian": (lambda d: _put(d, 4, ">I", 3), "big-endian GGUF files are not supported"),
    "absurd_tensor_count": (lambda d: _put(d, 8, "<Q", 1 << 40), "absurd tensor count 1099511627776"),
    "absurd_kv_count": (
        lambda d: _put(d, 16, "<Q", (1 << 64) - 1),
        "absurd metadata key/value count 18446744073709551615",
    ),
    "kv_count_too_high": (lambda d: _put(d, 16, "<Q", 9), "key of metadata entry 8 at offset"),
    "string_item_runs_to_eof": (_string_item_to_eof, "truncated: length of item 1 of 'tokenizer.ggml.tokens'"),
    "absurd_key_length": (
        lambda d: _put(d, 24, "<Q", 1 << 50),
        "key of metadata entry 0 at offset 24 has absurd length 1125899906842624",
    ),
    "absurd_string_value_length": (
        lambda d: _put(d, key_offset(d, "general.name") + 4, "<Q", 1 << 45),
        "value of 'general.name' at offset",
    ),
    "absurd_string_array_length": (
        _array_len("tokenizer.ggml.tokens", 1 << 60),
        "absurd array length of 'tokenizer.ggml.tokens' 1152921504606846976",
    ),
    "absurd_float_array_length": (
        _array_len("tokenizer.ggml.scores", 1 << 61),
        "absurd array length of 'tokenizer.ggml.scores'",
    ),
    "absurd_string_item_length": (
        lambda d: _put(d, key_offset(d, "tokenizer.ggml.tokens") + 4 + 4 + 8, "<Q", 1 << 40),
        "item 0 of 'tokenizer.ggml.tokens'",
    ),
    "unknown_value_type": (
        lambda d: _put(d, key_offset(d, "test.key_a"), "<I", 13),
        "metadata key 'test.key_a' has unknown value type 13",
    ),
    "unknown_array_item_type": (
        lambda d: _put(d, key_offset(d, "tokenizer.ggml.scores") + 4, "<I", 77),
        "metadata key 'tokenizer.ggml.scores' has unknown value type 77",
    ),
    "nested_array": (
        lambda d: _put(d, key_offset(d, "tokenizer.ggml.scores") + 4, "<I", int(GGUFValueType.ARRAY)),
        "'tokenizer.ggml.scores' is a nested array",
    ),
    "duplicate_key": (lambda d: _replace_once(d, b"test.key_b", b"test.key_a"), "duplicate metadata key 'test.key_a'"),
    "invalid_utf8_key": (lambda d: _replace_once(d, b"test.key_b", b"test.key_\xff"), "is not valid UTF-8"),
    "missing_architecture": (
        lambda d: _replace_once(d, b"general.architecture", b"general.architecturx"),
        "missing required metadata key 'general.architecture'",
    ),
    "duplicate_tensor": (lambda d: _replace_once(d, b"tensor_c", b"tensor_a"), "duplicate tensor name 'tensor_a'"),
    "n_dims_5": (_tensor_field("tensor_b", "n_dims", "<I", 5), "tensor 'tensor_b' has 5 dimensions (must be 1..4)"),
    "n_dims_0": (_tensor_field("tensor_b", "n_dims", "<I", 0), "tensor 'tensor_b' has 0 dimensions"),
    "n_dims_absurd": (_tensor_field("tensor_a", "n_dims", "<I", 0xFFFFFFFF), "has 4294967295 dimensions"),
    "zero_dim": (_tensor_field("tensor_a", "dims", "<Q", 0), "tensor 'tensor_a' has invalid shape [0, 4]"),
    "negative_dim": (_tensor_field("tensor_a", "dims", "<q", -32), "tensor 'tensor_a' has invalid shape [-32, 4]"),
    "huge_dims": (
        lambda d: _put(_tensor_field("tensor_a", "dims", "<Q", 1 << 62)(d),
                       tensor_info_offsets(d, "tensor_a")["dims"] + 8, "<Q", 1 << 62),
        "has too many elements",
    ),
    "huge_tensor": (_tensor_field("tensor_c", "dims", "<Q", 1 << 40), "tensor 'tensor_c' data (offset"),
    "unknown_type": (_tensor_field("tensor_b", "type", "<I", 99), "tensor 'tensor_b' has unknown type id 99"),
    "removed_type_q4_2": (_tensor_field("tensor_b", "type", "<I", 4), "tensor 'tensor_b' has unknown type id 4"),
    "row_not_multiple_of_block": (
        _tensor_field("tensor_b", "dims", "<Q", 48),
        "row length 48 is not a multiple of the Q8_0 block size 32",
    ),
    "offset_past_eof": (_tensor_field("tensor_c", "offset", "<Q", 1 << 40), "tensor 'tensor_c' data (offset"),
    "offset_max": (_tensor_field("tensor_c", "offset", "<Q", (1 << 64) - 32), "extends past the end of the file"),
    "misaligned": (
        _tensor_offset_delta("tensor_b", 4),
        "tensor 'tensor_b' data offset 516 is not a multiple of the alignment 32",
    ),
    "overlap": (_copy_tensor_offset("tensor_a", "tensor_c"), "overlaps tensor"),
    "overlap_partial": (_tensor_offset_delta("tensor_b", -32), "tensor 'tensor_b' data (offset"),
}


def _bad_alignment(value: int, vtype: GGUFValueType) -> Callable[[Path], bytes]:
    def build(tmp: Path) -> bytes:
        return valid_gguf(tmp / "align-base.gguf", extra_kv={"general.alignment": (value, vtype)}).read_bytes()

    return build


def _architecture_not_string(tmp: Path) -> bytes:
    d = valid_gguf(tmp / "arch-base.gguf", extra_kv={"test.architecture___": (7, GGUFValueType.UINT32)}).read_bytes()
    d = _replace_once(d, b"general.architecture", b"general.architecturx")
    return _replace_once(d, b"test.architecture___", b"general.architecture")


# Cases that need a different base file: built from scratch by the function.
BUILT_CASES: dict[str, tuple[Callable[[Path], bytes], str]] = {
    "architecture_not_string": (_architecture_not_string, "metadata key 'general.architecture' should be a string"),
    "alignment_not_power_of_two": (
        _bad_alignment(48, GGUFValueType.UINT32),
        "general.alignment must be a power of two, got 48",
    ),
    "alignment_zero": (_bad_alignment(0, GGUFValueType.UINT32), "general.alignment must be a power of two, got 0"),
    "alignment_float": (
        _bad_alignment(32.0, GGUFValueType.FLOAT32),
        "general.alignment must be a power of two, got 32.0",
    ),
}


def write_corpus(directory: str | Path) -> dict[str, tuple[Path, str]]:
    """Writes every corpus file under `directory`; returns {case: (path, expected message part)}."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    base = valid_gguf(directory / "base.gguf").read_bytes()
    out: dict[str, tuple[Path, str]] = {}
    for name, (corrupt, expected) in CASES.items():
        path = directory / f"{name}.gguf"
        path.write_bytes(corrupt(base))
        out[name] = (path, expected)
    for name, (build, expected) in BUILT_CASES.items():
        path = directory / f"{name}.gguf"
        path.write_bytes(build(directory))
        out[name] = (path, expected)
    return out
