"""`ggstation tokenize`: llama-tokenize's output, text taken verbatim."""

from __future__ import annotations

import io
import sys

import pytest

from engine.cli import main

pytestmark = pytest.mark.model


def run(capsys, *argv) -> str:
    assert main(["tokenize", *argv]) == 0
    return capsys.readouterr().out


def test_ids_output_is_a_python_style_list(capsys, smollm2_path):
    out = run(
        capsys, "-m", str(smollm2_path), "-p", "<|im_start|>user\nWhat is 2+2?<|im_end|>", "--ids"
    )
    assert out == "[1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2]\n"


def test_default_output_and_special_flags(capsys, gemma3_path):
    out = run(capsys, "-m", str(gemma3_path), "-p", "Hello world<start_of_turn>")
    assert out.splitlines() == [
        "     2 -> '<bos>'",
        "  9259 -> 'Hello'",
        "  1902 -> ' world'",
        "   105 -> '<start_of_turn>'",
    ]
    out = run(
        capsys,
        "-m",
        str(gemma3_path),
        "-p",
        "<start_of_turn>x",
        "--ids",
        "--no-bos",
        "--no-parse-special",
    )
    assert not out.startswith("[2,") and "105" not in out


def test_text_is_verbatim_from_prompt_file_and_stdin(capsys, monkeypatch, tmp_path, smollm2_path):
    model = str(smollm2_path)
    from_prompt = run(capsys, "-m", model, "-p", "a\\nb", "--ids")
    f = tmp_path / "t.txt"
    f.write_bytes(b"a\\nb")
    assert run(capsys, "-m", model, "-f", str(f), "--ids") == from_prompt
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a\\nb")))
    assert run(capsys, "-m", model, "--stdin", "--ids") == from_prompt
    assert from_prompt != run(
        capsys, "-m", model, "-p", "a\nb", "--ids"
    )  # backslash-n is two characters


def test_invalid_utf8_and_partial_pieces_are_shown_escaped(capsys, monkeypatch, smollm2_path):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xf0\x9f\xa6\x99")))
    out = run(capsys, "-m", str(smollm2_path), "--stdin")
    assert "\\x" in out and out.count("\n") >= 2


def test_missing_model_or_file_is_a_clean_error(capsys, tmp_path):
    assert main(["tokenize", "-m", str(tmp_path / "none.gguf"), "-p", "x"]) == 1
    assert "error:" in capsys.readouterr().err
