"""Tokenizer unit tests on small hand-made vocabularies (no model files, fast)."""

from __future__ import annotations

import random

import pytest

from engine.errors import TokenizerError
from engine.tokenizer import StreamingDetokenizer, load_tokenizer
from engine.tokenizer.base import _clean_up_spaces, llama_codepoints, to_bytes
from engine.tokenizer.bpe import BYTE_TO_UNICODE, PRE_TOKENIZERS, pre_tokenizer_regexes, split_words

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


# --- vocabularies -----------------------------------------------------------------------------
def bpe_meta(pre="gpt-2", **extra):
    specials = [
        ("<|endoftext|>", CONTROL),
        ("<|im_start|>", CONTROL),
        ("<|im_end|>", CONTROL),
        ("<tool>", USER_DEFINED),
    ]
    merges = [
        "h e",
        "l l",
        "ll o",
        "he llo",
        "Ġ w",
        "o r",
        "Ġw or",
        "Ġwor l",
        "Ġworl d",
        "Ġ Ġ",
        "ĠĠ ĠĠ",
        "' s",
        "Ġ ,",
    ]
    tokens = [t for t, _ in specials] + list(BYTE_TO_UNICODE)
    for m in merges:
        tok = m.replace(" ", "")
        if tok not in tokens:
            tokens.append(tok)
    types = [ty for _, ty in specials] + [NORMAL] * (len(tokens) - len(specials))
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
    }
    meta.update(extra)
    return meta


def spm_meta(**extra):
    entries = [
        ("<unk>", UNKNOWN, 0.0),
        ("<s>", CONTROL, 0.0),
        ("</s>", CONTROL, 0.0),
        ("<start_of_turn>", CONTROL, 0.0),
        ("<end_of_turn>", CONTROL, 0.0),
        ("  ", USER_DEFINED, 0.0),
    ]
    entries += [(f"<0x{b:02X}>", BYTE, 0.0) for b in range(256)]
    entries += [
        ("▁", NORMAL, -1.0),
        ("a", NORMAL, -2.0),
        ("b", NORMAL, -2.0),
        ("c", NORMAL, -2.0),
        ("▁a", NORMAL, -3.0),
        ("ab", NORMAL, -1.5),
        ("bc", NORMAL, -1.0),
        ("aa", NORMAL, -1.0),
        ("▁ab", NORMAL, -0.5),
        ("x", NORMAL, -5.0),
    ]
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [e[0] for e in entries],
        "tokenizer.ggml.token_type": [e[1] for e in entries],
        "tokenizer.ggml.scores": [e[2] for e in entries],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    meta.update(extra)
    return meta


@pytest.fixture(scope="module")
def bpe():
    return load_tokenizer(bpe_meta())


@pytest.fixture(scope="module")
def spm():
    return load_tokenizer(spm_meta())


def ids_of(tok, *texts):
    return [tok.token_to_id[t] for t in texts]


# --- loading ----------------------------------------------------------------------------------
def test_load_tokenizer_rejects_unknown_pre_tokenizer():
    with pytest.raises(TokenizerError, match="unknown pre-tokenizer type: 'nope'"):
        load_tokenizer(bpe_meta(pre="nope"))


def test_load_tokenizer_rejects_missing_model_and_unknown_model():
    with pytest.raises(TokenizerError, match="no tokenizer"):
        load_tokenizer({"tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(TokenizerError, match="unsupported tokenizer model 'wordpiece'"):
        load_tokenizer({"tokenizer.ggml.model": "wordpiece", "tokenizer.ggml.tokens": ["a"]})


def test_load_tokenizer_rejects_empty_vocab_and_duplicates():
    with pytest.raises(TokenizerError, match="vocabulary"):
        load_tokenizer({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": []})
    with pytest.raises(TokenizerError, match="duplicate token"):
        load_tokenizer({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b", "a"]})


def test_pre_tokenizers_required_by_the_issue_are_known():
    for pre in (
        "default",
        "gpt-2",
        "llama3",
        "llama-bpe",
        "qwen2",
        "smollm",
        "deepseek-llm",
        "starcoder",
    ):
        assert pre in PRE_TOKENIZERS
        assert pre_tokenizer_regexes(pre)


def test_bpe_special_ids_flags_and_eog(bpe):
    assert bpe.kind == "gpt2" and bpe.pre == "gpt-2"
    assert (bpe.bos_id, bpe.eos_id, bpe.unk_id, bpe.pad_id) == (0, 0, None, None)
    assert bpe.add_bos is False and bpe.add_eos is False
    assert bpe.eot_id == bpe.token_to_id["<|im_end|>"]  # found by its text, like llama.cpp
    assert bpe.is_eog(bpe.token_to_id["<|im_end|>"]) and bpe.is_eog(0)
    assert not bpe.is_eog(bpe.token_to_id["<|im_start|>"])
    assert bpe.is_control(1) and not bpe.is_control(bpe.token_to_id["<tool>"])
    assert bpe.n_vocab == len(bpe.tokens)


def test_spm_defaults_follow_llama_cpp(spm):
    assert spm.kind == "llama"
    assert (spm.bos_id, spm.eos_id, spm.unk_id) == (1, 2, 0)
    assert spm.add_bos and not spm.add_eos and spm.add_space_prefix
    assert load_tokenizer(spm_meta(**{"tokenizer.ggml.add_bos_token": False})).add_bos is False


# --- pre-tokenizer ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pre, text, words",
    [
        (
            "gpt-2",
            "Hello world  it's 12 ok\n\nx",
            ["Hello", " world", " ", " it", "'s", " 12", " ok", "\n", "\n", "x"],
        ),
        ("gpt-2", "hello   world  ", ["hello", "  ", " world", "  "]),
        (
            "llama3",
            "Hello world 12345\n\n  x",
            ["Hello", " world", " ", "123", "45", "\n\n", " ", " x"],
        ),
        ("llama3", "I'M here", ["I", "'M", " here"]),
        ("qwen2", "ab 123", ["ab", " ", "1", "2", "3"]),
        # smollm/starcoder split every digit first, so the space before a number stays on its own
        ("smollm", "a 123b", ["a", " ", "1", "2", "3", "b"]),
        ("smollm", "x  1", ["x", "  ", "1"]),
        ("deepseek-llm", "Hi there!\n12 ", ["Hi", " there", "!", "\n", "12", " "]),
    ],
)
def test_split_words_matches_llama_cpp_pre_tokenizers(pre, text, words):
    assert split_words(text, pre_tokenizer_regexes(pre)) == words


# --- BPE --------------------------------------------------------------------------------------
def test_bpe_merges_and_round_trip(bpe):
    assert bpe.encode("hello world") == ids_of(bpe, "hello", "Ġworld")
    assert bpe.decode(bpe.encode("hello world")) == "hello world"
    # unmerged bytes come out as single byte-level tokens
    assert bpe.encode("hé") == ids_of(bpe, "h", "Ã", "©")
    assert bpe.token_to_piece(bpe.token_to_id["Ã"]) == b"\xc3"


def test_bpe_parse_special_and_user_defined(bpe):
    im_start, im_end, tool = (bpe.token_to_id[t] for t in ("<|im_start|>", "<|im_end|>", "<tool>"))
    assert bpe.encode("<|im_start|>hello<|im_end|>", parse_special=True) == [
        im_start,
        bpe.token_to_id["hello"],
        im_end,
    ]
    plain = bpe.encode("<|im_start|>hello", parse_special=False)
    assert im_start not in plain and bpe.decode(plain) == "<|im_start|>hello"
    # user-defined tokens are matched whatever parse_special says (llama.cpp / HF behaviour)
    assert bpe.encode("a<tool>b", parse_special=False) == [
        *ids_of(bpe, "a"),
        tool,
        *ids_of(bpe, "b"),
    ]
    assert bpe.token_to_piece(im_start) == b"<|im_start|>"
    assert bpe.token_to_piece(im_start, special=False) == b""
    assert bpe.decode([im_start, bpe.token_to_id["hello"]], skip_special=True) == "hello"


def test_bpe_clean_spaces_for_gpt2_style_vocabularies(bpe):
    ids = bpe.encode("x , y 's") + bpe.encode("")
    assert bpe.decode(ids) == "x, y's"  # llama.cpp's clean_up_tokenization_spaces
    assert load_tokenizer(bpe_meta(pre="smollm")).decode(ids) == "x , y 's"  # smollm keeps spaces


@pytest.mark.parametrize(
    "raw, clean",
    [
        (b"a , b . c ! d ?", b"a, b. c! d?"),
        (b"x ' y", b"x'y"),
        (b"it 's I 'm we 're they 've don 't I 'll", b"it's I'm we're they've don 't I 'll"),
        (b"", b""),
        (b" ", b" "),
    ],
)
def test_clean_up_spaces_is_byte_exact(raw, clean):
    assert _clean_up_spaces(raw) == clean


def test_bpe_add_special_uses_metadata_flags():
    tok = load_tokenizer(
        bpe_meta(
            **{
                "tokenizer.ggml.add_bos_token": True,
                "tokenizer.ggml.add_eos_token": True,
                "tokenizer.ggml.bos_token_id": 1,
                "tokenizer.ggml.eos_token_id": 2,
            }
        )
    )
    assert tok.encode("he") == [1, tok.token_to_id["he"], 2]
    assert tok.encode("he", add_special=False) == [tok.token_to_id["he"]]
    assert tok.encode("") == [1, 2]
    assert tok.decode(tok.encode("he"), skip_special=True) == "he"


# --- SPM --------------------------------------------------------------------------------------
def test_spm_merges_highest_score_first_leftmost_on_ties(spm):
    # "bc" (-1.0) beats "ab" (-1.5): a|bc, not ab|c
    assert spm.encode("abc", add_special=False) == ids_of(spm, "▁a", "bc")
    assert load_tokenizer(spm_meta(**{"tokenizer.ggml.add_space_prefix": False})).encode(
        "abc", add_special=False
    ) == ids_of(spm, "a", "bc")
    # equal scores: the leftmost pair merges first
    no_prefix = load_tokenizer(spm_meta(**{"tokenizer.ggml.add_space_prefix": False}))
    assert no_prefix.encode("aaa", add_special=False) == ids_of(spm, "aa", "a")


def test_spm_space_prefix_bos_and_decode(spm):
    ids = spm.encode("ab ab")
    assert ids == [1, *ids_of(spm, "▁ab", "▁ab")]
    assert (
        spm.decode(ids) == "<s> ab ab"
    )  # special tokens rendered, as llama_detokenize(special=True)
    assert spm.decode(ids, skip_special=True) == " ab ab"
    assert (
        spm.decode(ids[1:]) == "ab ab"
    )  # the add_space_prefix space is removed when BOS is absent


def test_spm_byte_fallback_user_defined_and_specials(spm):
    want = [*ids_of(spm, "▁"), spm.token_to_id["<0xC3>"], spm.token_to_id["<0xA9>"]]
    assert spm.encode("é", add_special=False) == want
    assert spm.decode(spm.encode("é", add_special=False)) == "é"
    # user-defined "  " splits the text even without parse_special; like any special token it
    # makes the next fragment get the add_space_prefix space
    assert spm.encode("a  b", add_special=False) == [
        *ids_of(spm, "▁a"),
        spm.token_to_id["  "],
        *ids_of(spm, "▁", "b"),
    ]
    sot = spm.token_to_id["<start_of_turn>"]
    assert spm.encode("<start_of_turn>a", add_special=False, parse_special=True) == [
        sot,
        *ids_of(spm, "▁a"),
    ]
    assert sot not in spm.encode("<start_of_turn>a", add_special=False, parse_special=False)


def test_partition_applies_longest_special_token_first():
    meta = spm_meta()
    meta["tokenizer.ggml.tokens"] += ["xyz", "wx"]
    meta["tokenizer.ggml.token_type"] += [USER_DEFINED, USER_DEFINED]
    meta["tokenizer.ggml.scores"] += [0.0, 0.0]
    tok = load_tokenizer(meta)
    xyz, wx = tok.token_to_id["xyz"], tok.token_to_id["wx"]
    # "wx" starts first, but the longer "xyz" is applied first over the whole text (llama.cpp order)
    assert [t for t in tok.encode("wxyz", add_special=False) if t in (xyz, wx)] == [xyz]
    assert [t for t in tok.encode("wxwxyz", add_special=False) if t in (xyz, wx)] == [wx, xyz]


def test_rstrip_attribute_for_phi3_style_models():
    meta = spm_meta(**{"general.name": "Phi-3 mini"})
    tok = load_tokenizer(meta)
    # phi-3: special tokens eat the whitespace after them
    assert tok.encode("<end_of_turn>   a", add_special=False, parse_special=True) == [
        tok.token_to_id["<end_of_turn>"],
        *ids_of(tok, "▁a"),
    ]


# --- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["bpe", "spm"])
def test_bad_input_gives_defined_output(which, bpe, spm):
    tok = bpe if which == "bpe" else spm
    assert tok.encode("", add_special=False) == []
    assert tok.decode([]) == ""
    for text in ("\x00null", "a\ud800b", "\udcff", "\ufffd", "x" * 3, "\U0001f999"):
        ids = tok.encode(text, add_special=False)
        assert ids and all(0 <= i < tok.n_vocab for i in ids)
        assert isinstance(tok.decode(ids), str)
    assert tok.encode(b"a\xffb", add_special=False) == tok.encode(
        b"a\xffb".decode("utf-8", "surrogateescape"), add_special=False
    )
    assert (
        tok.decode([-1, tok.n_vocab, 10**9]) == ""
    )  # ids outside the vocabulary render as nothing
    with pytest.raises(TypeError):
        tok.encode(123)


def test_invalid_utf8_follows_llama_cpp():
    # llama.cpp turns each bad byte into U+FFFD for BPE, trusts lead bytes (overlong, surrogates)
    assert llama_codepoints(b"a\xffb".decode("utf-8", "surrogateescape")) == "a\ufffdb"
    assert llama_codepoints(b"\xe4\xbd".decode("utf-8", "surrogateescape")) == "\ufffd\ufffd"
    assert llama_codepoints(b"\xc0\x80".decode("utf-8", "surrogateescape")) == "\x00"
    assert to_bytes("\ud800") == b"\xef\xbf\xbd" and to_bytes("\udcff") == b"\xff"


def test_spm_invalid_utf8_uses_llama_cpp_byte_units(spm):
    # 0xFF claims 4 bytes in llama.cpp's split, so 'b' is swallowed into a byte-fallback unit
    ids = spm.encode(b"a\xffb", add_special=False)
    assert ids == [*ids_of(spm, "▁a"), spm.token_to_id["<0xFF>"], spm.token_to_id["<0x62>"]]
    assert spm.detokenize(ids) == b"a\xffb"
    assert spm.decode(ids) == "a\ufffdb"


def test_ten_megabyte_input_is_handled(spm, bpe):
    ids = spm.encode("ab c " * 2_000_000, add_special=False)
    assert len(ids) == 3 * 2_000_000 + 1 and spm.decode(ids[:6]) == "ab c ab c"  # + the final "▁"
    ids = bpe.encode(
        "hello world, " * 80_000 + "l" * 40_000, add_special=False
    )  # 1 MB, one 40k-char word
    assert (
        len(ids) == 4 * 80_000 + 20_000
    )  # hello, Ġworld, ",", Ġ (no "Ġ hello" merge) per copy; Ġ + 20k "ll"


def test_long_pieces_take_the_numba_merge_with_identical_results(bpe, spm):
    rng = random.Random(1)
    for _ in range(20):
        s = "".join(rng.choice("abc ▁x") for _ in range(rng.randint(300, 600)))
        py: list[int] = []
        spm._merge(list(s), spm.token_to_id, py)
        assert spm._merge_long(s.encode()) == py
        w = "".join(rng.choice("helowrdĠ',") for _ in range(rng.randint(300, 600)))
        assert bpe._merge_long(w) == [bpe.token_to_id[t] for t in bpe._merge(list(w))]
    assert bpe.encode("l" * 1000, add_special=False) == ids_of(bpe, "ll") * 500


# --- streaming --------------------------------------------------------------------------------
def test_streaming_detokenizer_never_splits_a_character(spm):
    ids = spm.encode("é€x", add_special=False)
    detok = StreamingDetokenizer(spm)
    deltas = [detok.add(i) for i in ids]
    assert "".join(deltas) + detok.flush() == b"".join(map(spm.token_to_piece, ids)).decode()
    for d in deltas:
        d.encode("utf-8")  # no lone surrogates / partial characters
    assert deltas[1] == ""  # first byte of 'é' held back
    detok = StreamingDetokenizer(spm)
    assert detok.add(spm.token_to_id["<0xC3>"]) == ""
    assert detok.flush() == "\ufffd"  # an unfinished character at the end becomes U+FFFD
    assert detok.add(spm.token_to_id["<s>"]) == ""  # control tokens are not shown by default
    assert StreamingDetokenizer(spm, special=True).add(spm.token_to_id["<s>"]) == "<s>"


def test_gemma4_bpe_escapes_spaces_merges_raw_text_and_falls_back_to_byte_tokens():
    tokens = [
        "<pad>",
        "<eos>",
        "<bos>",
        "\n",
        "\n\n",
        "▁",
        "h",
        "e",
        "l",
        "o",
        "he",
        "ll",
        "llo",
        "hello",
        "▁hello",
        "<0xC3>",
        "<0xA9>",
    ]
    types = [CONTROL, CONTROL, CONTROL] + [NORMAL] * 12 + [BYTE, BYTE]
    tok = load_tokenizer(
        {
            "tokenizer.ggml.model": "gemma4",
            "tokenizer.ggml.pre": "ignored",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": 2,
            "tokenizer.ggml.add_bos_token": False,  # llama.cpp turns it on for Gemma 4
            "tokenizer.ggml.merges": ["h e", "l l", "ll o", "he llo", "▁ hello"],
        }
    )
    ids = tok.encode("hello\n\n hello é")
    assert ids == [2, *ids_of(tok, "hello", "\n\n", "▁hello", "▁", "<0xC3>", "<0xA9>")]
    assert tok.pre == "gemma4" and tok.decode(ids, skip_special=True) == "hello\n\n hello é"
    assert tok.encode("\n\n\n", add_special=False) == ids_of(
        tok, "\n", "\n", "\n"
    )  # no such run: one by one
