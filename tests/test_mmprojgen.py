"""tests/mmprojgen.py writes the mmproj files llama.cpp's clip.cpp reads: the keys it requires,
the tensors its load_tensors asks for, shapes that fit its graphs, and the LM's special tokens.
(That llama.cpp really loads them is checked by hand with llama-mtmd-cli; see
scripts/mtmd_yardstick.py. llama.cpp is no test dependency.)"""

from __future__ import annotations

import io

import numpy as np
import pytest
from gguf import GGUFReader

from mmprojgen import (
    DEFAULT_SHAPES,
    F16,
    F32,
    GEMMA3_TOKENS,
    IDEFICS3_TOKENS,
    PROJECTORS,
    Q8_0,
    write_test_image,
    write_tiny_mmproj,
    write_tiny_vlm_pair,
)

# keys clip.cpp's load_hparams reads with required=true, plus the vision flag and type
REQUIRED_KEYS = [
    "general.architecture",
    "clip.has_vision_encoder",
    "clip.projector_type",
    "clip.vision.image_size",
    "clip.vision.patch_size",
    "clip.vision.embedding_length",
    "clip.vision.feed_forward_length",
    "clip.vision.block_count",
    "clip.vision.projection_dim",
    "clip.vision.attention.head_count",
    "clip.vision.attention.layer_norm_epsilon",
    "clip.vision.image_mean",
    "clip.vision.image_std",
]


def _read(path):
    r = GGUFReader(str(path))
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: ([int(x) for x in t.shape], t.tensor_type) for t in r.tensors}
    return kv, tensors


@pytest.mark.parametrize("projector", PROJECTORS)
@pytest.mark.parametrize("qtype", [F32, F16, Q8_0], ids=lambda q: q.name)
def test_mmproj_has_what_clip_cpp_loads(tmp_path, projector, qtype):
    lm, mm = write_tiny_vlm_pair(tmp_path, projector, qtype=qtype)
    kv, t = _read(mm)
    lm_kv, lm_t = _read(lm)
    s = DEFAULT_SHAPES[projector]
    n_embd, n_ff = s["n_embd"], s["n_ff"]
    for key in REQUIRED_KEYS:
        assert key in kv, key
    assert kv["general.architecture"] == "clip" and kv["clip.has_vision_encoder"] is True
    assert kv["clip.projector_type"] == projector
    assert kv["clip.use_gelu"] is (projector != "mlp")
    n_embd_lm = lm_kv[f"{lm_kv['general.architecture']}.embedding_length"]
    assert kv["clip.vision.projection_dim"] == n_embd_lm == 64
    # ggml_conv_2d kernel ne = (kw, kh, in, out); im2col takes F16 or F32 only
    p = s["patch_size"]
    assert t["v.patch_embd.weight"][0] == [p, p, 3, n_embd]
    assert t["v.patch_embd.weight"][1] in (F16, F32)
    n_patches = (s["image_size"] // p) ** 2
    n_pos = n_patches + (projector == "mlp")  # CLIP's class token
    assert t["v.position_embd.weight"][0] == [n_embd, n_pos]
    for il in range(s["n_layer"]):
        b = f"v.blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            assert t[b + name + ".weight"] == ([n_embd, n_embd], qtype)
        for name in ("ln1", "ln2"):
            assert t[b + name + ".weight"] == ([n_embd], F32)
        # the right way round: clip.cpp swaps up/down when ffn_down's ne[0] == n_embd
        assert t[b + "ffn_up.weight"][0] == [n_embd, n_ff]
        assert t[b + "ffn_down.weight"][0] == [n_ff, n_embd]
    assert f"v.blk.{s['n_layer']}.ln1.weight" not in t
    if projector == "gemma3":
        assert kv["clip.vision.projector.scale_factor"] == s["scale_factor"]
        assert t["mm.soft_emb_norm.weight"] == ([n_embd], F32)
        assert t["mm.input_projection.weight"] == ([n_embd_lm, n_embd], F16)  # always F16
        assert "v.post_ln.weight" in t and "v.class_embd" not in t
    elif projector == "idefics3":
        assert kv["clip.vision.preproc_image_size"] == s["preproc_image_size"]
        sf = kv["clip.vision.projector.scale_factor"]
        assert t["mm.model.fc.weight"] == ([n_embd * sf * sf, n_embd_lm], qtype)
    else:
        assert t["v.class_embd"] == ([n_embd], F32)
        assert "v.pre_ln.weight" in t and "v.post_ln.weight" not in t
        assert t["mm.0.weight"] == ([n_embd, n_embd_lm], qtype)
        assert t["mm.2.bias"] == ([n_embd_lm], F32)  # clip_n_mmproj_embd reads its ne[0]
    # the LM: its token_embd grew with the vocabulary
    n_vocab = len(lm_kv["tokenizer.ggml.tokens"])
    assert lm_t["token_embd.weight"][0] == [64, n_vocab]


def test_lm_vocab_has_mtmd_special_tokens(tmp_path):
    lm, _ = write_tiny_vlm_pair(tmp_path / "g", "gemma3")
    kv, _ = _read(lm)
    tokens = kv["tokenizer.ggml.tokens"]
    for tok in GEMMA3_TOKENS:
        assert kv["tokenizer.ggml.token_type"][tokens.index(tok)] == 3
    lm, _ = write_tiny_vlm_pair(tmp_path / "i", "idefics3")
    kv, _ = _read(lm)
    tokens = kv["tokenizer.ggml.tokens"]
    assert set(IDEFICS3_TOKENS) <= set(tokens)
    # mtmd looks up "\n\n" as one token: byte-level "ĊĊ", reachable through a merge
    assert "ĊĊ" in tokens and "Ċ Ċ" in kv["tokenizer.ggml.merges"]


def test_q8_0_falls_back_to_f16_for_short_rows(tmp_path):
    path = write_tiny_mmproj(tmp_path / "m.gguf", "mlp", 48, qtype=Q8_0, n_embd=48, n_ff=96)
    _, t = _read(path)
    assert t["v.blk.0.attn_q.weight"][1] == F16  # rows of 48 are not whole Q8_0 blocks
    assert t["v.blk.0.ffn_down.weight"][1] == Q8_0  # rows of 96 are


def test_pinpoints_and_weights_are_deterministic(tmp_path):
    a = write_tiny_mmproj(tmp_path / "a.gguf", "mlp", 64, pinpoints=True, seed=3)
    b = write_tiny_mmproj(tmp_path / "b.gguf", "mlp", 64, pinpoints=True, seed=3)
    assert a.read_bytes() == b.read_bytes()
    kv, t = _read(a)
    assert kv["clip.vision.mm_patch_merge_type"] == "spatial_unpad"
    assert list(kv["clip.vision.image_grid_pinpoints"]) == [28, 56, 56, 28, 56, 56]
    assert "v.image_newline" in t
    with pytest.raises(ValueError):
        write_tiny_mmproj(tmp_path / "c.gguf", "gemma3", 64, pinpoints=True)


def test_weights_keep_activations_small(tmp_path):
    # the scale that keeps a ViT sane: matrices near 1/sqrt(fan-in), norms near 1
    path = write_tiny_mmproj(tmp_path / "m.gguf", "gemma3", 64)
    r = GGUFReader(str(path))
    w = {t.name: np.asarray(t.data, dtype=np.float32) for t in r.tensors}
    assert 0.1 < w["v.blk.0.attn_q.weight"].std() < 0.3  # 1/sqrt(32) = 0.18
    assert abs(w["v.blk.0.ln1.weight"].mean() - 1.0) < 0.05


def test_test_image_is_deterministic(tmp_path):
    from PIL import Image

    a = write_test_image(tmp_path / "a.png", 40, 30, seed=1)
    assert (tmp_path / "a.png").read_bytes() == a == write_test_image(None, 40, 30, seed=1)
    assert a != write_test_image(None, 40, 30, seed=2)
    img = Image.open(io.BytesIO(write_test_image(None, 33, 17, seed=0, fmt="JPEG")))
    assert img.format == "JPEG" and img.size == (33, 17) and img.mode == "RGB"
