"""The tokenizers against llama.cpp's own output on the two starter models (tests/data)."""

from __future__ import annotations

import json

import pytest

from engine.gguf_file import GGUFFile
from engine.tokenizer import StreamingDetokenizer, load_tokenizer

COMBOS = [(False, False), (False, True), (True, False), (True, True)]

pytestmark = pytest.mark.model


def _rows(path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["results"]


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return load_tokenizer(GGUFFile(smollm2_path))


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    return load_tokenizer(GGUFFile(gemma3_path))


@pytest.fixture(params=["smollm2", "gemma3"])
def case(request, reference_dir):
    tok = request.getfixturevalue(request.param)
    return tok, _rows(reference_dir / f"tok-{request.param}.json")


def _piece_bytes(p) -> bytes:
    return p.encode("utf-8") if isinstance(p, str) else bytes(p)


def test_encode_matches_llama_cpp_for_every_row_and_flag_combination(case):
    tok, rows = case
    bad = []
    for row in rows:
        for add_special, parse_special in COMBOS:
            key = f"add_special={add_special},parse_special={parse_special}"
            got = tok.encode(row["text"], add_special=add_special, parse_special=parse_special)
            if got != row[key]:
                bad.append((row["text"], key, got, row[key]))
    assert not bad, f"{len(bad)} of {4 * len(rows)} differ, first: {bad[0]}"


def test_pieces_and_detokenized_match_llama_cpp(case):
    tok, rows = case
    for row in rows:
        ids = row["add_special=False,parse_special=True"]
        assert [tok.token_to_piece(i) for i in ids] == [_piece_bytes(p) for p in row["pieces"]], (
            row["text"]
        )
        assert tok.decode(ids) == row["detokenized"], row["text"]


def test_streaming_detokenizer_reassembles_every_row(case):
    tok, rows = case
    for row in rows:
        ids = row["add_special=False,parse_special=True"]
        detok = StreamingDetokenizer(tok, special=True)
        text = "".join(detok.add(i) for i in ids) + detok.flush()
        assert text == b"".join(tok.token_to_piece(i) for i in ids).decode("utf-8", "replace"), row[
            "text"
        ]


def test_smollm2_vocabulary_facts(smollm2):
    assert (smollm2.kind, smollm2.pre, smollm2.n_vocab) == ("gpt2", "smollm", 49152)
    assert (smollm2.bos_id, smollm2.eos_id, smollm2.add_bos, smollm2.add_eos) == (
        1,
        2,
        False,
        False,
    )
    assert smollm2.eot_id == 2  # <|im_end|>
    # <|endoftext|>, <|im_end|>, and <reponame>, which llama.cpp takes for the FIM repo token
    assert {t for t in range(smollm2.n_vocab) if smollm2.is_eog(t)} == {0, 2, 4}
    assert smollm2.is_control(1) and not smollm2.is_control(100)


def test_gemma3_vocabulary_facts(gemma3):
    assert (gemma3.kind, gemma3.n_vocab) == ("llama", 262144)
    assert (gemma3.bos_id, gemma3.eos_id, gemma3.pad_id, gemma3.unk_id) == (2, 1, 0, 3)
    assert gemma3.add_bos and not gemma3.add_eos and not gemma3.add_space_prefix
    assert gemma3.eot_id == 106  # <end_of_turn>
    assert gemma3.is_eog(1) and gemma3.is_eog(106) and not gemma3.is_eog(105)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_vocabularies_survive_bad_input(name, request):
    tok = request.getfixturevalue(name)
    for text in [
        "",
        "\x00",
        "a\ud83db",
        "\udcff\udc80",
        b"\xf0\x9f\xa6",
        b"\xc0\x80\xed\xa0\x80 x",
    ]:
        ids = tok.encode(text, add_special=False, parse_special=True)
        assert all(0 <= i < tok.n_vocab for i in ids)
        tok.decode(ids)
    # invalid bytes: BPE sees U+FFFD per bad byte (llama.cpp), SPM keeps the bytes (byte fallback)
    ids = tok.encode(b"x\xffy", add_special=False)
    expected = b"x\xef\xbf\xbdy" if tok.kind == "gpt2" else b"x\xffy"
    assert tok.detokenize(ids) == expected


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_greedy_reference_prompts_tokenize_like_llama_cpp(name, request, reference_dir):
    tok = request.getfixturevalue(name)
    for case in _rows(reference_dir / f"greedy-{name}.json"):
        assert (
            tok.encode(case["prompt"], add_special=True, parse_special=True) == case["prompt_ids"]
        )
