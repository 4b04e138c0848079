"""Prompts with images end to end: Projector.tokenize's layout per projector type (mtmd.cpp's
text around the tiles, BOS, placeholders), the bad-input errors, and `ggstation generate` /
`ggstation chat` with --image."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cli import main
from engine.errors import EngineError
from engine.model import load_model
from engine.vision import MEDIA_MARKER, MediaError, load_projector
from mmprojgen import write_test_image, write_tiny_vlm_pair


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("vlm-prompt")
    out = {}
    for kind in ("gemma3", "idefics3", "mlp"):
        lm, mm = write_tiny_vlm_pair(d / kind, kind, seed=4)
        model = load_model(lm)
        out[kind] = (lm, mm, model, load_projector(str(mm), model))
    yield out
    for _, _, model, proj in out.values():
        proj.close()
        model.close()


def _piece_ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special=False, parse_special=True)


def test_gemma3_wraps_the_image_in_its_markers(pairs):
    _, _, model, proj = pairs["gemma3"]
    tok = model.tokenizer
    img = write_test_image(None, 40, 30, 1)
    mp = proj.tokenize(tok, f"look {MEDIA_MARKER} now", [img], add_special=True)
    (span,) = mp.media
    assert span.n_tokens == 16 and span.non_causal
    beg, end = _piece_ids(tok, "<start_of_image>"), _piece_ids(tok, "<end_of_image>")
    assert len(beg) == len(end) == 1
    assert mp.tokens[span.start - 1] == beg[0] and mp.tokens[span.end] == end[0]
    assert all(t < 0 for t in mp.tokens[span.start : span.end])
    assert all(t >= 0 for i, t in enumerate(mp.tokens) if not span.start <= i < span.end)
    if tok.add_bos:
        assert mp.tokens[0] == tok.bos_id
    # the same image gives the same span id and placeholders; another image other ones
    again = proj.tokenize(tok, f"look {MEDIA_MARKER} now", [img], add_special=True)
    assert again.tokens == mp.tokens and again.media[0].id == span.id
    other = proj.tokenize(
        tok, f"look {MEDIA_MARKER} now", [write_test_image(None, 40, 30, 2)], add_special=True
    )
    assert other.media[0].id != span.id and other.tokens != mp.tokens


def test_idefics3_slices_then_the_overview(pairs):
    _, _, model, proj = pairs["idefics3"]
    tok = model.tokenizer
    mp = proj.tokenize(tok, MEDIA_MARKER, [write_test_image(None, 60, 50, 3)], add_special=False)
    assert len(mp.media) == 5  # 2x2 slices + the overview, 4 tokens each
    assert [m.n_tokens for m in mp.media] == [4] * 5
    text = tok.decode([t for t in mp.tokens if t >= 0])
    for marker in ("<row_1_col_1>", "<row_1_col_2>", "<row_2_col_1>", "<row_2_col_2>"):
        assert marker in text
    assert text.index("<row_2_col_2>") < text.index("<global-img>")
    assert text.endswith("<fake_token_around_image>")


def test_llava_one_span_of_patch_tokens(pairs):
    _, _, model, proj = pairs["mlp"]
    mp = proj.tokenize(
        model.tokenizer, MEDIA_MARKER + "hi", [write_test_image(None, 20, 30, 1)], add_special=True
    )
    assert [m.n_tokens for m in mp.media] == [16] and not mp.media[0].non_causal


def test_marker_and_image_counts_must_agree(pairs):
    _, _, model, proj = pairs["gemma3"]
    img = write_test_image(None, 8, 8, 1)
    with pytest.raises(MediaError, match=r"media markers in text \(2\).*bitmaps \(1\)"):
        proj.tokenize(model.tokenizer, MEDIA_MARKER * 2, [img], add_special=True)
    with pytest.raises(MediaError, match=r"\(0\).*\(1\)"):
        proj.tokenize(model.tokenizer, "no marker", [img], add_special=True)


@pytest.mark.parametrize(
    "data",
    [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\0" * 40],
    ids=["empty", "text", "truncated-png"],
)
def test_a_corrupt_image_is_a_media_error(pairs, data):
    _, _, model, proj = pairs["mlp"]
    with pytest.raises(MediaError, match="failed to load image"):
        proj.tokenize(model.tokenizer, MEDIA_MARKER, [data], add_special=True)


def test_embeddings_are_computed_once(pairs):
    _, _, model, proj = pairs["gemma3"]
    mp = proj.tokenize(
        model.tokenizer, MEDIA_MARKER, [write_test_image(None, 30, 30, 5)], add_special=True
    )
    a = mp.media[0].embed()
    assert mp.media[0].embed() is a and np.isfinite(a).all() and a.shape == (16, proj.n_embd)


def test_generate_with_an_image(pairs, tmp_path, capsys):
    lm, mm, model, proj = pairs["gemma3"]
    img = tmp_path / "cat.png"
    data = write_test_image(img, 64, 48, 7)
    args = ["generate", "-m", str(lm), "--mmproj", str(mm), "--image", str(img)]
    args += ["-p", "describe", "-n", "6", "--temp", "0", "-c", "256"]
    assert main(args) == 0
    out = capsys.readouterr()
    assert out.out
    # llama-mtmd-cli puts the image before a prompt without a marker; 16 image tokens count
    want = proj.tokenize(model.tokenizer, MEDIA_MARKER + "describe", [data], add_special=True)
    assert f"prompt eval: {len(want.tokens)} tokens" in out.err


def test_generate_image_errors(pairs, tmp_path, capsys):
    lm, mm, _, _ = pairs["gemma3"]
    img = tmp_path / "x.png"
    write_test_image(img, 16, 16, 1)
    assert main(["generate", "-m", str(lm), "--image", str(img), "-p", "x", "-n", "1"]) != 0
    assert "--mmproj" in capsys.readouterr().err
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"garbage")
    rc = main(
        ["generate", "-m", str(lm), "-mm", str(mm), "--image", str(bad), "-p", "x", "-n", "1"]
    )
    assert rc != 0 and "failed to load image" in capsys.readouterr().err
    rc = main(["generate", "-m", str(lm), "-mm", str(lm), "-p", "x", "-n", "1"])
    assert rc != 0 and "not a multimodal projector" in capsys.readouterr().err


def test_chat_session_with_an_image(pairs):
    from engine.commands.chat import ChatSession
    from engine.context import Context, ContextParams
    from engine.sampling import SamplingParams
    from engine.tokenizer.chat_template import ChatTemplate

    lm, mm, model, proj = pairs["gemma3"]
    ctx = Context(model, ContextParams(n_ctx=256))
    chat = ChatSession(
        ctx,
        model.tokenizer,
        ChatTemplate.from_gguf(model.gguf),
        SamplingParams(temperature=0.0),
        n_predict=3,
        projector=proj,
    )
    chat.attach(write_test_image(None, 32, 32, 1))
    chat.respond("what is it?", lambda s: None)
    tokens, media = chat.prompt_tokens()
    assert len(media) == 1 and chat.messages[0]["content"].startswith(MEDIA_MARKER)
    last = chat.respond("and now?", lambda s: None)
    assert last.n_cached >= media[0].end  # the image's KV was reused on the second turn
    with pytest.raises(EngineError, match="projector"):
        ChatSession(
            ctx, model.tokenizer, ChatTemplate.from_gguf(model.gguf), SamplingParams()
        ).attach(b"x")
