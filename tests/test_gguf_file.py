"""GGUFFile: valid files read like gguf.GGUFReader reads them; hostile files raise GGUFError."""

from __future__ import annotations

import gc
import os
import random
import struct
import time

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize

import hostile_gguf
from engine.errors import GGUFError, MetadataError
from engine.gguf_file import GGUFFile


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return hostile_gguf.write_corpus(tmp_path_factory.mktemp("hostile"))


@pytest.fixture()
def base_path(tmp_path):
    return hostile_gguf.valid_gguf(tmp_path / "base.gguf")


ALL_CASES = [*hostile_gguf.CASES, *hostile_gguf.BUILT_CASES]


@pytest.mark.parametrize("case", ALL_CASES)
def test_gguf_file_hostile_case_raises_specific_error(corpus, case):
    path, expected = corpus[case]
    with pytest.raises(GGUFError) as exc:
        GGUFFile(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: "), msg
    assert expected in msg


def test_gguf_file_missing_path_and_directory(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(GGUFError, match="is a directory"):
        GGUFFile(tmp_path)


def test_gguf_file_reads_base_like_gguf_reader(base_path):
    f = GGUFFile(base_path)
    reader = GGUFReader(base_path)
    expected_meta = {k: v.contents() for k, v in reader.fields.items() if not k.startswith("GGUF.")}
    assert dict(f.metadata) == expected_meta
    assert list(f.metadata) == list(expected_meta)
    assert f.version == 3 and f.alignment == 32 and f.file_size == os.path.getsize(base_path)
    for t in reader.tensors:
        info = f.tensors[t.name]
        assert info.qtype == t.tensor_type
        assert info.shape == tuple(int(x) for x in t.shape)
        assert (info.offset, info.nbytes) == (t.data_offset, t.n_bytes)
        assert info.data.dtype == t.data.dtype and info.data.shape == t.data.shape
        assert np.array_equal(info.data, t.data)
    assert f.tensor_data_bytes == 512 + 136 + 32


def test_gguf_file_tensors_are_zero_copy_views(base_path):
    f = GGUFFile(base_path)
    a = f.tensors["tensor_a"].data
    assert isinstance(a.base, np.ndarray) or isinstance(a, np.memmap)
    assert not a.flags.writeable
    # plain ndarrays: numba types an np.memmap subclass through its slow Python path, on
    # every kernel call that takes a weight
    assert all(type(t.data) is np.ndarray for t in f.tensors.values())
    expected = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_array_equal(a, expected)


def test_gguf_file_typed_getters(base_path):
    f = GGUFFile(base_path)
    assert f.arch == "llama"
    assert f.get_str("general.name") == "hostile-base"
    assert f.get_int("llama.block_count") == 1
    assert f.get_float("test.key_a") == 1.0
    assert f.get_bool("test.key_b") is True
    assert f.get_array("tokenizer.ggml.tokens") == ["a", "b", "c"]
    assert f.get_array("tokenizer.ggml.scores") == [0.0, 1.0, 2.0]
    assert f.has("test.key_a") and not f.has("nope")
    assert f.get("nope", 7) == 7 and f.get_int("nope", None) is None
    with pytest.raises(GGUFError, match=f"{base_path}: missing required metadata key 'llama.nope'"):
        f.get_int("llama.nope")
    with pytest.raises(GGUFError, match="should be a string"):
        f.get_str("llama.block_count")
    with pytest.raises(GGUFError, match="should be an integer"):
        f.get_int("general.name")
    with pytest.raises(GGUFError, match="should be an array"):
        f.get_array("general.name")


def test_gguf_file_qtensor_and_vector(base_path):
    f = GGUFFile(base_path)
    w = f.qtensor("tensor_b", (64, 2))
    assert (w.n_rows, w.n_cols, w.qtype) == (2, 64, GGMLQuantizationType.Q8_0)
    assert w.raw.shape == (2, 68) and w.raw.dtype == np.uint8
    np.testing.assert_array_equal(f.vector("tensor_c", 8), np.arange(8, dtype=np.float32))
    np.testing.assert_allclose(f.vector("tensor_b"), dequantize(w.raw, w.qtype).reshape(-1))
    with pytest.raises(GGUFError, match="has shape \\[64, 2\\], expected \\[64, 3\\]"):
        f.qtensor("tensor_b", (64, 3))
    with pytest.raises(GGUFError, match="missing tensor 'nope'"):
        f.qtensor("nope")


def test_gguf_file_custom_alignment(tmp_path):
    path = hostile_gguf.valid_gguf(tmp_path / "a64.gguf", alignment=64)
    f = GGUFFile(path)
    assert f.alignment == 64 and f.data_offset % 64 == 0
    assert all((t.offset - f.data_offset) % 64 == 0 for t in f.tensors.values())
    np.testing.assert_array_equal(f.vector("tensor_c"), np.arange(8, dtype=np.float32))


def test_gguf_file_version_2_accepted(base_path):
    data = bytearray(base_path.read_bytes())
    struct.pack_into("<I", data, 4, 2)
    base_path.write_bytes(bytes(data))
    assert GGUFFile(base_path).version == 2


def test_gguf_file_bad_utf8_in_string_array_raises_on_access(base_path):
    data = base_path.read_bytes()
    item0 = hostile_gguf.key_offset(data, "tokenizer.ggml.tokens") + 16  # item type, count
    data = data[: item0 + 8] + b"\xff" + data[item0 + 9 :]
    base_path.write_bytes(data)
    f = GGUFFile(base_path)  # arrays are decoded lazily
    with pytest.raises(
        GGUFError, match="item 0 of metadata key 'tokenizer.ggml.tokens' is not valid UTF-8"
    ):
        f.get_array("tokenizer.ggml.tokens")


def test_gguf_file_metadata_after_close_is_clear_error(base_path):
    f = GGUFFile(base_path)
    assert f.get_str("general.name") == "hostile-base"  # scalars stay readable
    f.close()
    with pytest.raises(GGUFError, match="file is closed"):
        f.get_array("tokenizer.ggml.tokens")


def _open_and_touch(path) -> None:
    f = GGUFFile(path)
    for key in f.metadata:
        f.metadata[key]
    for info in f.tensors.values():
        np.asarray(info.data).view(np.uint8).sum()


def test_gguf_file_fuzz_flips_and_truncations_only_raise_gguf_error(base_path, tmp_path):
    """Random corruption of the header must give GGUFError or a file that reads, nothing else."""
    rng = random.Random(1234)
    base = base_path.read_bytes()
    header_end = GGUFFile(base_path).data_offset
    target = tmp_path / "fuzz.gguf"
    outcomes = {"ok": 0, "error": 0}
    t0 = time.perf_counter()
    for _ in range(400):
        data = bytearray(base)
        kind = rng.choice(["flip", "flip", "byte", "u64", "truncate"])
        if kind == "truncate":
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(header_end)
                if kind == "flip":
                    data[at] ^= 1 << rng.randrange(8)
                elif kind == "byte":
                    data[at] = rng.randrange(256)
                elif at + 8 <= len(data):
                    struct.pack_into(
                        "<Q", data, at, rng.choice([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1])
                    )
        target.write_bytes(bytes(data))
        try:
            _open_and_touch(target)
            outcomes["ok"] += 1
        except GGUFError as e:
            assert str(e).startswith(str(target)), e
            outcomes["error"] += 1
    assert outcomes["error"] > 100 and outcomes["ok"] > 10, outcomes
    assert time.perf_counter() - t0 < 30  # a hang guard, not a speed check: 400 opens take ~0.1 s


VOCAB_TOKENS = [f"tok{i}" for i in range(300_000)]
# Opening reads the header and locates big arrays without decoding them. Measured on the
# 2-core development machine with other test runs beside it: 0.07-0.09 s for the 300k-token
# file, 0.06-0.08 s for Gemma 3 (262k tokens). The bound is >10x that; what it guards
# against, parsing every array element at open as gguf.GGUFReader does, takes 11 s on Gemma 3.
OPEN_LIMIT_S = 1.0


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory):
    """A GGUF with a 300k-entry string array and a 300k-entry int array."""
    from gguf import GGUFWriter

    path = tmp_path_factory.mktemp("vocab") / "vocab.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", VOCAB_TOKENS)
    w.add_key_value(
        "tokenizer.ggml.token_type", [1] * 300_000, GGUFValueType.ARRAY, GGUFValueType.INT32
    )
    w.add_tensor("t", np.zeros(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _timed_open(path) -> tuple[GGUFFile, float]:
    t0 = time.perf_counter()
    f = GGUFFile(path)
    return f, time.perf_counter() - t0


def test_gguf_file_large_string_array_reads_back(vocab_path):
    f = GGUFFile(vocab_path)
    assert f.get_array("tokenizer.ggml.tokens") == VOCAB_TOKENS
    assert f.get_array("tokenizer.ggml.token_type")[:3] == [1, 1, 1]


@pytest.mark.perf
def test_gguf_file_large_string_array_opens_fast(vocab_path, perf_figure):
    """Big vocabularies are located at open time and decoded only on access."""
    perf_figure(
        "GGUF open, 300k-token vocabulary", _timed_open(vocab_path)[1], "s", at_most=OPEN_LIMIT_S
    )


@pytest.mark.model
def test_gguf_file_gemma3_metadata(gemma3_path):
    f = GGUFFile(gemma3_path)
    assert f.arch == "gemma3" and len(f.get_array("tokenizer.ggml.tokens")) == 262144
    assert f.tensor_data_bytes <= f.file_size


@pytest.mark.model
@pytest.mark.perf
def test_gguf_file_gemma3_opens_fast(gemma3_path, perf_figure):
    perf_figure("GGUF open, Gemma 3 270M", _timed_open(gemma3_path)[1], "s", at_most=OPEN_LIMIT_S)


@pytest.mark.model
def test_gguf_file_smollm2_matches_gguf_reader(smollm2_path):
    f = GGUFFile(smollm2_path)
    reader = GGUFReader(smollm2_path)
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            assert f.metadata[key] == field.contents(), key
    assert len(f.tensors) == len(reader.tensors)
    for t in reader.tensors:
        info = f.tensors[t.name]
        assert (info.qtype, info.offset, info.nbytes) == (t.tensor_type, t.data_offset, t.n_bytes)
        assert info.data.shape == t.data.shape and info.data.dtype == t.data.dtype


# -- typed getters: the key, what was expected and what the file holds, in one line -----------


@pytest.fixture()
def typed_path(tmp_path):
    return hostile_gguf.valid_gguf(
        tmp_path / "typed.gguf",
        extra_kv={
            "llama.context_length": (2**63, GGUFValueType.UINT64),
            "llama.embedding_length": (-64, GGUFValueType.INT32),
            "llama.rope.freq_base": (float("nan"), GGUFValueType.FLOAT32),
            "llama.attention.head_count": (8.0, GGUFValueType.FLOAT32),
            "test.flag": ("yes", GGUFValueType.STRING),
            "test.ints": ([1, 2], GGUFValueType.ARRAY),
        },
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda f: f.get_int("llama.context_length"),
            "metadata key 'llama.context_length' is 9223372036854775808, out of range (1..16777216)",
        ),
        (
            lambda f: f.get_int("llama.embedding_length"),
            "metadata key 'llama.embedding_length' is -64, out of range (1..1048576)",
        ),
        (
            lambda f: f.get_float("llama.rope.freq_base"),
            "metadata key 'llama.rope.freq_base' should be a finite number, found float32 nan",
        ),
        (
            lambda f: f.get_int("llama.attention.head_count"),
            "metadata key 'llama.attention.head_count' should be an integer, found float32 8.0",
        ),
        (
            lambda f: f.get_int("general.name"),
            "metadata key 'general.name' should be an integer, found string 'hostile-base'",
        ),
        (
            lambda f: f.get_bool("test.flag"),
            "metadata key 'test.flag' should be a boolean, found string 'yes'",
        ),
        (
            lambda f: f.get_array("tokenizer.ggml.scores", item="string"),
            "metadata key 'tokenizer.ggml.scores' should be an array of strings, found array of 3 float32",
        ),
        (
            lambda f: f.get_array("tokenizer.ggml.tokens", item="number"),
            "metadata key 'tokenizer.ggml.tokens' should be an array of numbers, found array of 3 string",
        ),
        (
            lambda f: f.get_str("test.ints"),
            "metadata key 'test.ints' should be a string, found array of 2 int32",
        ),
        (
            lambda f: f.get_int("test.key_a", lo=2, hi=5),
            "metadata key 'test.key_a' is 1, out of range (2..5)",
        ),
    ],
)
def test_typed_getters_name_key_expected_and_found(typed_path, call, message):
    f = GGUFFile(typed_path)
    with pytest.raises(MetadataError) as exc:
        call(f)
    assert str(exc.value) == f"{typed_path}: {message}"


def test_typed_readers_on_a_plain_mapping():
    from engine.metadata import meta_array, meta_int

    meta = {"a": "x", "b": [1, "2"], "c": 3}
    with pytest.raises(
        MetadataError, match="^metadata key 'a' should be an integer, found str 'x'$"
    ):
        meta_int(meta, "a")
    with pytest.raises(MetadataError, match="should be an array of integers, found array of 2 int"):
        meta_array(meta, "b", item="int")
    assert meta_int(meta, "c") == 3 and meta_int(meta, "nope", None) is None


# -- a failed load lets go of the map at once ---------------------------------------------------


def _mapped(path) -> bool:
    with open("/proc/self/maps") as fh:
        return os.path.realpath(path) in fh.read()


def _tiny_with(tmp_path, name, change):
    """A tiny llama with one change made to its parts (hostile_gguf.Layout)."""
    from ggufgen import write_tiny_model

    base = write_tiny_model(tmp_path / "tiny-base.gguf").read_bytes()
    layout = hostile_gguf.parse_layout(base)
    change(layout)
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(hostile_gguf.build_layout(layout))
    return path


def _drop_tensor(layout):  # fails in load_weights, after tensors were bound
    layout.tensors = [t for t in layout.tensors if t.name != "blk.1.ffn_down.weight"]


def _bad_merges(layout):  # fails in the tokenizer, after every tensor was bound
    layout.kv("tokenizer.ggml.merges").vtype, layout.kv("tokenizer.ggml.merges").value = (
        GGUFValueType.UINT32,
        7,
    )


def _overlap(layout):  # fails while opening, after tensor views were made
    layout.tensors[-1].offset = layout.tensors[-2].offset


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps (Linux)")
@pytest.mark.parametrize(
    "change, error",
    [
        (_drop_tensor, "missing tensor 'blk.1.ffn_down.weight'"),
        (_bad_merges, "'tokenizer.ggml.merges' should be an array of strings"),
        (_overlap, "overlaps tensor"),
    ],
)
def test_failed_load_unmaps_the_file_without_the_garbage_collector(tmp_path, change, error):
    from engine import inspect_model
    from engine.errors import EngineError
    from engine.model import load_model

    path = _tiny_with(tmp_path, change.__name__, change)
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(EngineError, match=error) as exc:
            load_model(path, n_threads=1)
        assert not _mapped(path)  # while the exception, its traceback and frames are alive
        assert error in (inspect_model(path).error or "")
        assert not _mapped(path)
        del exc
    finally:
        gc.enable()


def test_gguf_file_closed_flag(base_path):
    f = GGUFFile(base_path)
    assert not f.closed
    f.close()
    assert f.closed and f.tensors == {}
