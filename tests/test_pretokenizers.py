"""Every BPE pre-tokenizer type (tokenizer.ggml.pre) against llama-tokenize's ids on SmolLM2's
vocabulary (tests/data/pretok-smollm2.json, made by tests/compare_pretokenizers.py)."""

from __future__ import annotations

import json

import pytest

from engine.errors import EngineError, TokenizerError
from engine.gguf_file import GGUFFile
from engine.tokenizer import PRE_TOKENIZERS, load_tokenizer
from engine.tokenizer.bpe import pre_tokenizer_regexes, split_words
from ggufgen import vocab_only_copy, write_tiny_model

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def reference(reference_dir) -> list[dict]:
    return json.loads((reference_dir / "pretok-smollm2.json").read_text(encoding="utf-8"))[
        "results"
    ]


@pytest.fixture(scope="module")
def smollm2_meta(smollm2_path) -> dict:
    """The starter model's metadata as vocab_only_copy leaves it (no add_bos/add_eos keys)."""
    meta = dict(GGUFFile(smollm2_path).metadata)
    for key in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"):
        meta.pop(key, None)
    return meta


def _tokenizer(meta: dict, pre: str):
    return load_tokenizer({**meta, "tokenizer.ggml.pre": pre})


def test_reference_covers_every_pre_tokenizer_we_know(reference):
    assert set(reference[0]["pre"]) == set(PRE_TOKENIZERS)
    assert len(reference) >= 60 and sum(len(r["pre"]) for r in reference) > 2000


def test_every_pre_tokenizer_matches_llama_tokenize(reference, smollm2_meta):
    bad, n = [], 0
    for pre in PRE_TOKENIZERS:
        tok = _tokenizer(smollm2_meta, pre)
        for row in reference:
            if pre in row["pre"]:
                n += 1
                got = tok.encode(row["text"], add_special=True, parse_special=False)
                if got != row["variants"][row["pre"][pre]]:
                    bad.append((pre, row["text"], got))
    assert not bad, f"{len(bad)} of {n} differ, first: {bad[0]}"


def test_vocab_only_gguf_loads_like_its_metadata(tmp_path, smollm2_path, smollm2_meta, reference):
    path = vocab_only_copy(smollm2_path, tmp_path / "gpt-4o.gguf", "gpt-4o")
    from_file, from_meta = load_tokenizer(str(path)), _tokenizer(smollm2_meta, "gpt-4o")
    assert from_file.pre == "gpt-4o" and not from_file.clean_spaces
    for row in reference:
        assert from_file.encode(row["text"], parse_special=False) == from_meta.encode(
            row["text"], parse_special=False
        )


def test_pre_tokenizers_see_text_as_llama_cpp_does():
    # letters assigned after llama.cpp's Unicode table (U+1C89, U+A7CB) are no letters there
    assert split_words("x\u1c89y \ua7cbz", pre_tokenizer_regexes("gpt-4o")) == [
        "x",
        "\u1c89y",
        " \ua7cb",
        "z",
    ]
    # gpt-4o's case lookaheads: a non-ASCII letter is upper and lower case at once
    assert split_words("l'été L'ÉTÉ", pre_tokenizer_regexes("gpt-4o")) == [
        "l",
        "'été",
        " L",
        "'ÉTÉ",
    ]
    # afmoe digit groups (tiny_aya's first regex): the text before a run stays with its first group
    assert split_words("abc1234567 x12", pre_tokenizer_regexes("tiny_aya")[:1]) == [
        "abc1",
        "234",
        "567",
        " x12",
    ]
    # kimi-k2: Han blocks whole (U+FA6E is unassigned), other letters apart
    words = split_words("(中) a中 '中\ufa6e(", pre_tokenizer_regexes("kimi-k2"))
    assert words == ["(", "中", ")", " a", "中", " '", "中\ufa6e", "("]


def test_unknown_pre_tokenizer_names_the_known_ones(tmp_path, smollm2_path):
    path = vocab_only_copy(smollm2_path, tmp_path / "nope.gguf", "no-such-pre")
    with pytest.raises(TokenizerError, match="unknown pre-tokenizer type: 'no-such-pre'") as err:
        load_tokenizer(str(path))
    assert "gpt-4o" in str(err.value) and "qwen2" in str(err.value)
    assert "gpt2" not in PRE_TOKENIZERS  # llama.cpp knows "gpt-2", not "gpt2"


def test_unknown_pre_tokenizer_stops_model_loading(tmp_path, monkeypatch):
    import ggufgen
    from engine.model import load_model

    monkeypatch.setitem(ggufgen.BPE_PRE, "qwen2", "no-such-pre")
    path = write_tiny_model(tmp_path / "tiny-qwen2.gguf", arch="qwen2")
    with pytest.raises(EngineError, match="unknown pre-tokenizer type: 'no-such-pre'"):
        load_model(path)
