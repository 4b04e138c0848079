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


def valid_gguf(
    path: str | Path, *, alignment: int | None = None, extra_kv: dict | None = None
) -> Path:
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
    "absurd_tensor_count": (
        lambda d: _put(d, 8, "<Q", 1 << 40),
        "absurd tensor count 1099511627776",
    ),
    "absurd_kv_count": (
        lambda d: _put(d, 16, "<Q", (1 << 64) - 1),
        "absurd metadata key/value count 18446744073709551615",
    ),
    "kv_count_too_high": (lambda d: _put(d, 16, "<Q", 9), "key of metadata entry 8 at offset"),
    "string_item_runs_to_eof": (
        _string_item_to_eof,
        "truncated: length of item 1 of 'tokenizer.ggml.tokens'",
    ),
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
        lambda d: _put(
            d, key_offset(d, "tokenizer.ggml.scores") + 4, "<I", int(GGUFValueType.ARRAY)
        ),
        "'tokenizer.ggml.scores' is a nested array",
    ),
    "duplicate_key": (
        lambda d: _replace_once(d, b"test.key_b", b"test.key_a"),
        "duplicate metadata key 'test.key_a'",
    ),
    "invalid_utf8_key": (
        lambda d: _replace_once(d, b"test.key_b", b"test.key_\xff"),
        "is not valid UTF-8",
    ),
    "missing_architecture": (
        lambda d: _replace_once(d, b"general.architecture", b"general.architecturx"),
        "missing required metadata key 'general.architecture'",
    ),
    "duplicate_tensor": (
        lambda d: _replace_once(d, b"tensor_c", b"tensor_a"),
        "duplicate tensor name 'tensor_a'",
    ),
    "n_dims_5": (
        _tensor_field("tensor_b", "n_dims", "<I", 5),
        "tensor 'tensor_b' has 5 dimensions (must be 1..4)",
    ),
    "n_dims_0": (
        _tensor_field("tensor_b", "n_dims", "<I", 0),
        "tensor 'tensor_b' has 0 dimensions",
    ),
    "n_dims_absurd": (
        _tensor_field("tensor_a", "n_dims", "<I", 0xFFFFFFFF),
        "has 4294967295 dimensions",
    ),
    "zero_dim": (
        _tensor_field("tensor_a", "dims", "<Q", 0),
        "tensor 'tensor_a' has invalid shape [0, 4]",
    ),
    "negative_dim": (
        _tensor_field("tensor_a", "dims", "<q", -32),
        "tensor 'tensor_a' has invalid shape [-32, 4]",
    ),
    "huge_dims": (
        lambda d: _put(
            _tensor_field("tensor_a", "dims", "<Q", 1 << 62)(d),
            tensor_info_offsets(d, "tensor_a")["dims"] + 8,
            "<Q",
            1 << 62,
        ),
        "has too many elements",
    ),
    "huge_tensor": (
        _tensor_field("tensor_c", "dims", "<Q", 1 << 40),
        "tensor 'tensor_c' data (offset",
    ),
    "unknown_type": (
        _tensor_field("tensor_b", "type", "<I", 99),
        "tensor 'tensor_b' has unknown type id 99",
    ),
    "removed_type_q4_2": (
        _tensor_field("tensor_b", "type", "<I", 4),
        "tensor 'tensor_b' has unknown type id 4",
    ),
    "row_not_multiple_of_block": (
        _tensor_field("tensor_b", "dims", "<Q", 48),
        "row length 48 is not a multiple of the Q8_0 block size 32",
    ),
    "offset_past_eof": (
        _tensor_field("tensor_c", "offset", "<Q", 1 << 40),
        "tensor 'tensor_c' data (offset",
    ),
    "offset_max": (
        _tensor_field("tensor_c", "offset", "<Q", (1 << 64) - 32),
        "extends past the end of the file",
    ),
    "misaligned": (
        _tensor_offset_delta("tensor_b", 4),
        "tensor 'tensor_b' data offset 516 is not a multiple of the alignment 32",
    ),
    "overlap": (_copy_tensor_offset("tensor_a", "tensor_c"), "overlaps tensor"),
    "overlap_partial": (_tensor_offset_delta("tensor_b", -32), "tensor 'tensor_b' data (offset"),
}


def _bad_alignment(value: int, vtype: GGUFValueType) -> Callable[[Path], bytes]:
    def build(tmp: Path) -> bytes:
        return valid_gguf(
            tmp / "align-base.gguf", extra_kv={"general.alignment": (value, vtype)}
        ).read_bytes()

    return build


def _architecture_not_string(tmp: Path) -> bytes:
    d = valid_gguf(
        tmp / "arch-base.gguf", extra_kv={"test.architecture___": (7, GGUFValueType.UINT32)}
    ).read_bytes()
    d = _replace_once(d, b"general.architecture", b"general.architecturx")
    return _replace_once(d, b"test.architecture___", b"general.architecture")


# Cases that need a different base file: built from scratch by the function.
BUILT_CASES: dict[str, tuple[Callable[[Path], bytes], str]] = {
    "architecture_not_string": (
        _architecture_not_string,
        "metadata key 'general.architecture' should be a string",
    ),
    "alignment_not_power_of_two": (
        _bad_alignment(48, GGUFValueType.UINT32),
        "general.alignment must be a power of two, got 48",
    ),
    "alignment_zero": (
        _bad_alignment(0, GGUFValueType.UINT32),
        "general.alignment must be a power of two, got 0",
    ),
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


# --- the fuzz corpus: seeded mutations of a tiny runnable model ---------------------------------
#
# A tiny real model from ggufgen (llama with a gpt2 BPE vocabulary, gemma3 with a
# SentencePiece one, phi3 with LongRoPE keys) is parsed into its parts (key/value entries,
# tensor infos, the data blob), mutated there, and written back with the header re-padded, so
# that a type swap or a longer string keeps every tensor's data where its offset says: loading
# then gets past the header into config, tokenizer and model construction. Byte-level cases
# (bit flips in the header, overwritten u64 fields, truncation) are applied to the written file.
# `fuzz_case(bases, i, seed)` builds case i; the same (i, seed) always gives the same bytes.

FUZZ_ARCHS = ("llama", "gemma3", "phi3")
DEFAULT_ALIGNMENT = 32
_T = GGUFValueType
_SCALAR_FMT = {
    _T.UINT8: "<B",
    _T.INT8: "<b",
    _T.UINT16: "<H",
    _T.INT16: "<h",
    _T.UINT32: "<I",
    _T.INT32: "<i",
    _T.FLOAT32: "<f",
    _T.BOOL: "<?",
    _T.UINT64: "<Q",
    _T.INT64: "<q",
    _T.FLOAT64: "<d",
}


class KV:
    """One metadata entry: value type, value (a list for arrays) and the arrays' item type."""

    def __init__(self, key: str, vtype: int, value, item_type: int | None = None):
        self.key, self.vtype, self.value, self.item_type = key, vtype, value, item_type


class TensorEntry:
    def __init__(self, name: str, dims: list[int], ttype: int, offset: int):
        self.name, self.dims, self.ttype, self.offset = (
            name,
            dims,
            ttype,
            offset,
        )  # offset: data-relative


class Layout:
    """A GGUF taken apart: entries, tensor infos and the tensor data blob."""

    def __init__(
        self, version: int, kvs: list[KV], tensors: list[TensorEntry], data: bytes, alignment: int
    ):
        self.version, self.kvs, self.tensors, self.data, self.alignment = (
            version,
            kvs,
            tensors,
            data,
            alignment,
        )

    def copy(self) -> Layout:
        kvs = [
            KV(k.key, k.vtype, list(k.value) if isinstance(k.value, list) else k.value, k.item_type)
            for k in self.kvs
        ]
        ts = [TensorEntry(t.name, list(t.dims), t.ttype, t.offset) for t in self.tensors]
        return Layout(self.version, kvs, ts, self.data, self.alignment)

    def kv(self, key: str) -> KV | None:
        return next((k for k in self.kvs if k.key == key), None)


def parse_layout(data: bytes) -> Layout:
    """The parts of a valid GGUF (no checks: the input is ggufgen's)."""
    pos = 24
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)

    def read(fmt: str):
        nonlocal pos
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    def read_str() -> str:
        nonlocal pos
        n = read("<Q")
        pos += n
        return data[pos - n : pos].decode("utf-8")

    def read_value(vtype: int):
        return read_str() if vtype == _T.STRING else read(_SCALAR_FMT[_T(vtype)])

    kvs = []
    for _ in range(n_kv):
        key, vtype = read_str(), read("<I")
        if vtype == _T.ARRAY:
            item, n = read("<I"), read("<Q")
            kvs.append(KV(key, vtype, [read_value(item) for _ in range(n)], item))
        else:
            kvs.append(KV(key, vtype, read_value(vtype)))
    tensors = []
    for _ in range(n_tensors):
        name, n_dims = read_str(), read("<I")
        dims = [read("<Q") for _ in range(n_dims)]
        tensors.append(TensorEntry(name, dims, read("<I"), read("<Q")))
    align_kv = next((k for k in kvs if k.key == "general.alignment"), None)
    alignment = align_kv.value if align_kv else DEFAULT_ALIGNMENT
    start = -(-pos // alignment) * alignment
    return Layout(version, kvs, tensors, data[start:], alignment)


def _pack_value(vtype: int, value) -> bytes:
    if vtype == _T.STRING:
        raw = value.encode("utf-8", "surrogatepass")
        return struct.pack("<Q", len(raw)) + raw
    return struct.pack(_SCALAR_FMT[_T(vtype)], value)


def build_layout(layout: Layout) -> bytes:
    """The GGUF bytes of `layout`: header, entries, tensor infos, padding, data."""
    out = bytearray(
        struct.pack("<4sIQQ", b"GGUF", layout.version, len(layout.tensors), len(layout.kvs))
    )
    for k in layout.kvs:
        out += _pack_value(_T.STRING, k.key) + struct.pack("<I", k.vtype)
        if k.vtype == _T.ARRAY:
            out += struct.pack("<IQ", k.item_type, len(k.value))
            out += b"".join(_pack_value(k.item_type, v) for v in k.value)
        else:
            out += _pack_value(k.vtype, k.value)
    for t in layout.tensors:
        out += _pack_value(_T.STRING, t.name) + struct.pack("<I", len(t.dims))
        out += b"".join(struct.pack("<Q", d) for d in t.dims) + struct.pack(
            "<IQ", t.ttype, t.offset
        )
    out += bytes(-len(out) % layout.alignment)
    return bytes(out) + layout.data


_NAN, _INF = float("nan"), float("inf")
# (value type, value, item type): values of every type, the awkward ones of each
ODD_VALUES = [
    (_T.STRING, "", None),
    (_T.STRING, "x", None),
    (_T.STRING, "4096", None),
    (_T.STRING, "llama", None),
    (_T.UINT8, 255, None),
    (_T.INT8, -128, None),
    (_T.UINT16, 65535, None),
    (_T.INT16, -1, None),
    (_T.UINT32, 0, None),
    (_T.UINT32, 1, None),
    (_T.UINT32, 3, None),
    (_T.UINT32, 2**31, None),
    (_T.UINT32, 2**32 - 1, None),
    (_T.INT32, -1, None),
    (_T.INT32, -(2**31), None),
    (_T.UINT64, 2**63, None),
    (_T.UINT64, 2**64 - 1, None),
    (_T.INT64, -1, None),
    (_T.INT64, 2**40, None),
    (_T.INT64, -(2**63), None),
    (_T.FLOAT32, _NAN, None),
    (_T.FLOAT32, _INF, None),
    (_T.FLOAT32, -_INF, None),
    (_T.FLOAT32, -1.0, None),
    (_T.FLOAT32, 0.0, None),
    (_T.FLOAT32, 1.5, None),
    (_T.FLOAT32, 3.4e38, None),
    (_T.FLOAT32, 1e-45, None),
    (_T.FLOAT64, 1e300, None),
    (_T.FLOAT64, _NAN, None),
    (_T.BOOL, True, None),
    (_T.BOOL, False, None),
    (_T.ARRAY, [], _T.STRING),
    (_T.ARRAY, [], _T.INT32),
    (_T.ARRAY, ["a", "b"], _T.STRING),
    (_T.ARRAY, [1, 2, 3], _T.INT32),
    (_T.ARRAY, [_NAN, 1.0], _T.FLOAT32),
    (_T.ARRAY, [2**63], _T.UINT64),
    (_T.ARRAY, [-5], _T.INT64),
    (_T.ARRAY, [True, False], _T.BOOL),
    (_T.ARRAY, [255] * 4, _T.UINT8),
]
# Keys the engine reads that a model may lack ("{a}" is the architecture): added with odd values.
OPTIONAL_KEYS = [
    "{a}.vocab_size",
    "{a}.attention.key_length",
    "{a}.attention.value_length",
    "{a}.attention.head_count_kv",
    "{a}.rope.dimension_count",
    "{a}.rope.scaling.type",
    "{a}.rope.scaling.factor",
    "{a}.rope.scaling.attn_factor",
    "{a}.rope.freq_base_swa",
    "{a}.rope.scaling.original_context_length",
    "{a}.attention.sliding_window",
    "{a}.attention.sliding_window_pattern",
    "{a}.attn_logit_softcapping",
    "{a}.final_logit_softcapping",
    "general.alignment",
    "general.file_type",
    "general.name",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.model",
    "tokenizer.chat_template",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
]
ODD_DIMS = [0, 1, 2, 31, 33, 64, 1 << 20, 1 << 40, 2**63, 2**64 - 1]
ODD_U64 = [0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]


def fuzz_bases(directory: str | Path) -> dict[str, tuple[bytes, Layout]]:
    """The tiny models the fuzz cases mutate: {arch: (bytes, layout)}."""
    from ggufgen import write_tiny_model

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for arch in FUZZ_ARCHS:
        data = write_tiny_model(
            directory / f"fuzz-base-{arch}.gguf", arch=arch, n_layer=2
        ).read_bytes()
        out[arch] = (data, parse_layout(data))
    return out


def _mutate_array(rng, kv: KV) -> str:
    n = len(kv.value)
    op = rng.choice(["empty", "truncate", "extend", "retype", "odd_item", "duplicate"])
    if op == "empty" or n == 0:
        kv.value = []
    elif op == "truncate":
        kv.value = kv.value[: rng.randrange(n)]
    elif op == "extend":
        kv.value = kv.value + kv.value[: rng.randint(1, 4)]
    elif op == "retype":  # same items, another item type (numbers as strings, strings as lengths)
        kv.item_type, kv.value = rng.choice(
            [
                (_T.STRING, [str(v) for v in kv.value]),
                (_T.INT32, [len(str(v)) for v in kv.value]),
                (_T.FLOAT32, [float(len(str(v))) for v in kv.value]),
                (_T.BOOL, [True] * n),
                (_T.UINT64, [2**63] * n),
                (_T.INT8, [-1] * n),
            ]
        )
    elif op == "odd_item":
        i = rng.randrange(n)
        if kv.item_type == _T.STRING:
            kv.value[i] = rng.choice(
                ["", " ", "a", kv.value[0], "\ud800", "x" * 5000, "a b c", "<0xZZ>"]
            )
        elif kv.item_type in (_T.FLOAT32, _T.FLOAT64):
            kv.value[i] = rng.choice([_NAN, _INF, -_INF, 3.4e38])
        elif kv.item_type in (_T.INT32, _T.INT64, _T.INT8, _T.INT16):
            kv.value[i] = rng.choice([-1, 0, 7, 99, 127])
        else:
            kv.value[i] = rng.choice([0, 7, 99, 255])
    else:  # a later item repeats an earlier one
        if n > 1:
            kv.value[rng.randrange(1, n)] = kv.value[0]
    return f"array_{op}"


def _mutate_layout(rng, layout: Layout, arch: str) -> str:
    op = rng.choice(
        [
            "swap_type",
            "swap_type",
            "odd_optional",
            "delete_key",
            "array",
            "array",
            "tensor_dim",
            "tensor_ndims",
            "tensor_type",
            "tensor_offset",
            "tensor_name",
            "tensor_drop",
            "tensor_swap",
        ]
    )
    if op in ("swap_type", "delete_key"):
        kv = rng.choice(layout.kvs)
        if op == "delete_key":
            layout.kvs.remove(kv)
            return f"delete:{kv.key}"
        kv.vtype, kv.value, kv.item_type = rng.choice(ODD_VALUES)
        kv.value = list(kv.value) if isinstance(kv.value, list) else kv.value
        return f"swap_type:{kv.key}"
    if op == "odd_optional":
        key = rng.choice(OPTIONAL_KEYS).format(a=arch)
        vtype, value, item = rng.choice(ODD_VALUES)
        value = list(value) if isinstance(value, list) else value
        kv = layout.kv(key)
        if kv is None:
            layout.kvs.append(KV(key, vtype, value, item))
        else:
            kv.vtype, kv.value, kv.item_type = vtype, value, item
        return f"odd:{key}"
    if op == "array":
        arrays = [k for k in layout.kvs if k.vtype == _T.ARRAY]
        if not arrays:
            return "array_none"
        kv = rng.choice(arrays)
        return f"{_mutate_array(rng, kv)}:{kv.key}"
    t = rng.choice(layout.tensors)
    if op == "tensor_dim":
        t.dims[rng.randrange(len(t.dims))] = rng.choice(ODD_DIMS)
    elif op == "tensor_ndims":
        t.dims = t.dims + [1] if len(t.dims) < 4 and rng.random() < 0.5 else t.dims[:-1] or [0]
    elif op == "tensor_type":
        t.ttype = rng.choice([0, 1, 2, 6, 8, 12, 14, 30, 39, 40, 41, 99, 2**31, 2**32 - 1])
    elif op == "tensor_offset":
        other = rng.choice(layout.tensors)
        t.offset = rng.choice(
            [
                other.offset,
                t.offset + layout.alignment,
                t.offset + 1,
                len(layout.data),
                len(layout.data) - layout.alignment,
                2**63,
                2**64 - 32,
            ]
        )
    elif op == "tensor_name":
        t.name = rng.choice(
            [rng.choice(layout.tensors).name, t.name + "x", "", t.name.replace("blk.0", "blk.9")]
        )
    elif op == "tensor_drop":
        layout.tensors.remove(t)
    else:
        u = rng.choice(layout.tensors)
        t.name, u.name = u.name, t.name
    return f"{op}:{t.name}"


def _mutate_bytes(rng, data: bytes, header_end: int) -> tuple[bytes, str]:
    op = rng.choice(["flip", "flip", "byte", "u64", "truncate"])
    b = bytearray(data)
    if op == "truncate":
        return bytes(b[: rng.randrange(len(b))]), op
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(header_end)
        if op == "flip":
            b[at] ^= 1 << rng.randrange(8)
        elif op == "byte":
            b[at] = rng.randrange(256)
        elif at + 8 <= len(b):
            struct.pack_into("<Q", b, at, rng.choice(ODD_U64))
    return bytes(b), op


def fuzz_case(bases: dict[str, tuple[bytes, Layout]], i: int, seed: int = 0) -> tuple[str, bytes]:
    """Case i of the corpus: (a name saying what was done, the file's bytes)."""
    import random

    rng = random.Random(seed * 1_000_003 + i)
    arch = FUZZ_ARCHS[i % len(FUZZ_ARCHS)]
    data, layout = bases[arch]
    if rng.random() < 0.2:  # byte surgery on the whole file
        header_end = len(data) - len(layout.data)
        mutated, op = _mutate_bytes(rng, data, header_end)
        return f"{i}-{arch}-{op}", mutated
    layout = layout.copy()
    ops = [_mutate_layout(rng, layout, arch) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    return f"{i}-{arch}-{'+'.join(ops)}", build_layout(layout)


def write_fuzz_corpus(directory: str | Path, n: int = 200, seed: int = 0) -> dict[str, Path]:
    """Writes cases 0..n-1 under `directory`; returns {case name: path}."""
    directory = Path(directory)
    bases = fuzz_bases(directory / "bases")
    out = {}
    for i in range(n):
        name, data = fuzz_case(bases, i, seed)
        path = directory / f"fuzz-{i:05d}.gguf"
        path.write_bytes(data)
        out[name] = path
    return out
