"""engine/gguf_split.py: a split set (llama.cpp's gguf-split naming) opens as one file; the
ways a set can be wrong give one clear line each."""

from __future__ import annotations

import shutil

import pytest

from engine.errors import GGUFError
from engine.gguf_split import SplitGGUFFile, open_gguf, parse_split_name, split_paths
from ggufgen import write_tiny_model


@pytest.fixture(scope="module")
def split_set(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    first = write_tiny_model(d / "m.gguf", split_max_tensors=8)
    whole = write_tiny_model(d / "whole.gguf")
    return first, whole


def test_split_names_follow_llama_cpp():
    assert parse_split_name("Q4/m-Q4_K_M-00002-of-00005.gguf") == ("Q4/m-Q4_K_M", 1, 5)
    assert (
        parse_split_name("m-Q4_K_M.gguf") is None
        and parse_split_name("m-00006-of-00005.gguf") is None
    )
    assert [p.name for p in split_paths("/x/m-00002-of-00003.gguf")] == [
        "m-00001-of-00003.gguf",
        "m-00002-of-00003.gguf",
        "m-00003-of-00003.gguf",
    ]


def test_split_set_opens_as_one_file(split_set):
    first, whole = split_set
    f, g = open_gguf(first), open_gguf(whole)
    assert isinstance(f, SplitGGUFFile) and len(f.paths) == 3
    assert sorted(f.tensors) == sorted(g.tensors) and f.tensor_data_bytes == g.tensor_data_bytes
    last = sorted(f.tensors)[-1]  # a tensor of another part than the first
    assert (f.tensors[last].data == g.tensors[last].data).all()
    f.close()
    assert not f.tensors and all(not s.tensors for s in f.shards)


def test_split_set_errors_are_clear(split_set, tmp_path):
    first, _ = split_set
    with pytest.raises(
        GGUFError, match="part 2 of a 3-part split model; load it from its first part"
    ):
        open_gguf(first.with_name("m-00002-of-00003.gguf"))
    for p in split_paths(first)[:2]:
        shutil.copy(p, tmp_path / p.name)
    with pytest.raises(GGUFError, match="part 3 of 3 is missing"):
        open_gguf(tmp_path / first.name)
    renamed = tmp_path / "renamed.gguf"
    shutil.copy(first, renamed)
    with pytest.raises(GGUFError, match="split model, but the file was renamed"):
        open_gguf(renamed)
